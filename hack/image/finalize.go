package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entrypoint is where the upstream EPP image keeps its binary; manifests and
// scripts written for upstream run "/epp", so the drop-in must too.
const entrypoint = "/epp"

// koAppDir is where ko v0.18.0 puts the binary (pkg/build/gobuild.go,
// buildOne: appDir) and what it makes the entrypoint.
const koAppDir = "/ko-app/"

// exposedPorts are the EPP's default listeners: ext-proc gRPC, gRPC health
// and Prometheus metrics (GIE v1.5.0 pkg/epp/server/options.go).
var exposedPorts = []string{"9002/tcp", "9003/tcp", "9090/tcp"}

// imageLabels are the OCI annotation keys finalize sets as config labels.
const (
	labelSource   = "org.opencontainers.image.source"
	labelVersion  = "org.opencontainers.image.version"
	labelRevision = "org.opencontainers.image.revision"
	labelTitle    = "org.opencontainers.image.title"
)

// finalizeOptions are the release facts recorded in the image.
type finalizeOptions struct {
	version, revision, source string
}

func runFinalize(args []string, stderr io.Writer) error {
	flags := newFlagSet("finalize", stderr)
	in := flags.String("in", "", "tarball written by `ko build --tarball` (one image)")
	out := flags.String("out", "", "output tarball, docker-loadable")
	tag := flags.String("tag", "", "tag recorded in the output tarball, e.g. sluice/epp:v0.1.0")
	var opts finalizeOptions
	flags.StringVar(&opts.version, "version", "", "value of the "+labelVersion+" label")
	flags.StringVar(&opts.revision, "revision", "", "value of the "+labelRevision+" label (git commit)")
	flags.StringVar(&opts.source, "source", "https://github.com/sluice-gw/sluice", "value of the "+labelSource+" label")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if err := requireFlags(flags, "in", "out", "tag", "version", "revision", "source"); err != nil {
		return err
	}
	if flags.NArg() != 0 {
		return fmt.Errorf("finalize: unexpected arguments %q", flags.Args())
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		return fmt.Errorf("finalize: --tag: %w", err)
	}

	koImage, err := tarball.ImageFromPath(*in, nil)
	if err != nil {
		return fmt.Errorf("reading ko output %s: %w", *in, err)
	}
	img, err := finalize(koImage, opts)
	if err != nil {
		return fmt.Errorf("finalizing %s: %w", *in, err)
	}
	if err := writeTarball(*out, ref, img); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s: %s (manifest %s)\n", *out, ref, digest)
	return nil
}

// finalize turns ko's image into the shipped one: it appends a layer with
// /epp pointing at ko's binary and replaces the runtime config. ko's own
// layers are kept byte for byte.
func finalize(img v1.Image, opts finalizeOptions) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	ep := cf.Config.Entrypoint
	if len(ep) != 1 || !strings.HasPrefix(ep[0], koAppDir) {
		return nil, fmt.Errorf("entrypoint %q is not a single ko binary under %s (was ko run with --debug?)", ep, koAppDir)
	}
	mt, err := img.MediaType()
	if err != nil {
		return nil, err
	}
	layer, err := symlinkLayer(entrypoint, ep[0], layerMediaType(mt))
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   cf.Created,
			CreatedBy: "sluice hack/image finalize",
			Comment:   entrypoint + " -> " + ep[0],
		},
	})
	if err != nil {
		return nil, err
	}

	cf, err = img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Config.Entrypoint = []string{entrypoint}
	cf.Config.Cmd = nil
	cf.Config.User = nonrootUser
	cf.Config.WorkingDir = "/"
	cf.Config.ExposedPorts = make(map[string]struct{}, len(exposedPorts))
	for _, p := range exposedPorts {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	cf.Config.Labels[labelSource] = opts.source
	cf.Config.Labels[labelVersion] = opts.version
	cf.Config.Labels[labelRevision] = opts.revision
	cf.Config.Labels[labelTitle] = "sluice-epp"
	return mutate.ConfigFile(img, cf)
}

// layerMediaType matches the new layer to the manifest format: registries
// reject images that mix Docker and OCI layer types.
func layerMediaType(manifest types.MediaType) types.MediaType {
	if manifest == types.OCIManifestSchema1 {
		return types.OCILayer
	}
	return types.DockerLayer
}

// symlinkLayer returns a layer holding one absolute symlink, so /epp costs
// a few bytes instead of a second copy of the binary.
func symlinkLayer(path, target string, mt types.MediaType) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeSymlink,
		Name:     strings.TrimPrefix(path, "/"),
		Linkname: target,
		Mode:     0o777,
		ModTime:  fixedTime,
		Format:   tar.FormatUSTAR,
	}); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(mt))
}

// writeTarball writes img to out through a temporary file in the same
// directory, so out is either the previous file or the complete new one.
func writeTarball(out string, ref name.Tag, img v1.Image) (err error) {
	dir := filepath.Dir(out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(out)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, os.Remove(f.Name()))
		}
	}()
	if err := tarball.Write(ref, img, f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}
