package main

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testCABundle returns a PEM bundle with one freshly generated self-signed
// CA certificate.
func testCABundle(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             time.Unix(0, 0),
		NotAfter:              time.Unix(0, 0).AddDate(100, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func mustDigest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestBuildBaseIsReproducible(t *testing.T) {
	ca := testCABundle(t)
	first, err := buildBase(ca)
	if err != nil {
		t.Fatal(err)
	}
	second, err := buildBase(bytes.Clone(ca))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustDigest(t, first), mustDigest(t, second); a != b {
		t.Errorf("same CA bundle gave digests %s and %s", a, b)
	}
	other, err := buildBase(testCABundle(t))
	if err != nil {
		t.Fatal(err)
	}
	if mustDigest(t, first) == mustDigest(t, other) {
		t.Error("different CA bundles gave the same digest: bundle not in the image?")
	}
}

func TestBuildBaseContents(t *testing.T) {
	ca := testCABundle(t)
	img, err := buildBase(ca)
	if err != nil {
		t.Fatal(err)
	}
	if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type = %q, %v; want OCI, so ko types its layers as OCI", mt, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.User != "65532:65532" {
		t.Errorf("config = %s/%s user %q, want linux/amd64 user 65532:65532", cf.OS, cf.Architecture, cf.Config.User)
	}
	if cf.RootFS.Type != "layers" || len(cf.RootFS.DiffIDs) != 1 {
		t.Errorf("rootfs = %+v, want type \"layers\" with one diff ID", cf.RootFS)
	}
	if !cf.Created.Time.Equal(time.Unix(0, 0)) {
		t.Errorf("created = %v, want the Unix epoch (reproducible)", cf.Created)
	}
	files := flatten(t, img)
	checkNonrootBase(t, files)
	if got := files["/etc/ssl/certs/ca-certificates.crt"].data; !bytes.Equal(got, ca) {
		t.Error("CA bundle in the image differs from the input bundle")
	}
	if tmp := files["/tmp"].hdr; tmp == nil || tmp.Mode != 0o1777 {
		t.Errorf("/tmp = %+v, want a directory with mode 1777", tmp)
	}
	for p, e := range files {
		if !e.hdr.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s mtime = %v, want the Unix epoch", p, e.hdr.ModTime)
		}
	}
}

func TestReadCABundle(t *testing.T) {
	dir := t.TempDir()
	if _, err := readCABundle(filepath.Join(dir, "missing.crt")); err == nil || !strings.Contains(err.Error(), "ca-certificates") {
		t.Errorf("missing bundle: err = %v, want a hint to install ca-certificates", err)
	}
	junk := filepath.Join(dir, "junk.crt")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readCABundle(junk); err == nil || !strings.Contains(err.Error(), "no PEM certificates") {
		t.Errorf("junk bundle: err = %v, want a no-certificates error", err)
	}
	good := filepath.Join(dir, "good.crt")
	if err := os.WriteFile(good, testCABundle(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readCABundle(good); err != nil {
		t.Errorf("valid bundle: %v", err)
	}
}

// TestStoreBase checks the layout the way ko v0.18.0 reads it
// (pkg/commands/cache.go): the index lists the digest once and every blob
// is there, also after a run that found a blob missing.
func TestStoreBase(t *testing.T) {
	img, err := buildBase(testCABundle(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ko", "img")
	digest := mustDigest(t, img)

	assertStored := func(t *testing.T) {
		t.Helper()
		ref, err := storeBase(dir, defaultBaseRepo, img)
		if err != nil {
			t.Fatal(err)
		}
		if want := defaultBaseRepo + "@" + digest.String(); ref.String() != want {
			t.Errorf("reference = %s, want %s", ref, want)
		}
		p, err := layout.FromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		index, err := p.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		descs, err := partial.FindManifests(index, match.Digests(digest))
		if err != nil || len(descs) != 1 {
			t.Fatalf("index entries for %s = %d (%v), want 1", digest, len(descs), err)
		}
		if bad, err := incompleteBlobs(p, img); len(bad) != 0 || err != nil {
			t.Fatalf("blobs incomplete after storeBase: %v, %v", bad, err)
		}
		stored, err := index.Image(digest)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mutate.Extract(stored).Read(make([]byte, 1)); err != nil {
			t.Errorf("stored layer unreadable: %v", err)
		}
	}
	t.Run("cold", assertStored)
	t.Run("warm", assertStored)
	t.Run("missing layer blob", func(t *testing.T) {
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		h, err := layers[0].Digest()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(dir, "blobs", h.Algorithm, h.Hex)); err != nil {
			t.Fatal(err)
		}
		assertStored(t)
	})
	t.Run("truncated manifest blob", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(dir, "blobs", digest.Algorithm, digest.Hex), []byte("{"), 0o644); err != nil {
			t.Fatal(err)
		}
		assertStored(t)
	})
}

// koLikeImage mimics `ko build` output: base plus /ko-app/epp, with ko's
// entrypoint, round-tripped through a docker tarball as ko --tarball does.
func koLikeImage(t *testing.T, entrypoint []string) v1.Image {
	t.Helper()
	base, err := buildBase(testCABundle(t))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	bin := []byte("\x7fELF stand-in")
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "ko-app/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: "ko-app/epp", Mode: 0o555, Size: int64(len(bin))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write(bin); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Entrypoint = entrypoint
	cf.Config.Cmd = []string{"--ko-default"}
	cf.Config.Labels = map[string]string{"kept": "yes"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ko.tar")
	if err := tarball.WriteToFile(path, nil, img); err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}

func TestFinalize(t *testing.T) {
	koImage := koLikeImage(t, []string{"/ko-app/epp"})
	img, err := finalize(koImage, finalizeOptions{version: "v1.2.3", revision: "abc123", source: "https://example.com/sluice"})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, cf, "v1.2.3", "abc123")
	if cf.Config.Labels["kept"] != "yes" {
		t.Errorf("labels = %v: finalize dropped ko's labels", cf.Config.Labels)
	}
	if len(cf.History) == 0 || cf.History[len(cf.History)-1].CreatedBy != "sluice hack/image finalize" {
		t.Errorf("history = %+v, want finalize's layer recorded last", cf.History)
	}

	koLayers, err := koImage.Layers()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != len(koLayers)+1 {
		t.Fatalf("layers = %d, want ko's %d plus one", len(layers), len(koLayers))
	}
	for i, l := range koLayers {
		a, _ := l.DiffID()
		b, _ := layers[i].DiffID()
		if a != b {
			t.Errorf("layer %d changed: %s -> %s", i, a, b)
		}
	}

	files := flatten(t, img)
	if link := files["/epp"].hdr; link == nil || link.Typeflag != tar.TypeSymlink || link.Linkname != "/ko-app/epp" {
		t.Errorf("/epp = %+v, want a symlink to /ko-app/epp", link)
	}
	if target, _ := resolve(t, files, "/epp"); target != "/ko-app/epp" {
		t.Errorf("/epp resolves to %s", target)
	}

	// Written and read back as the Makefile does.
	out := filepath.Join(t.TempDir(), "bin", "image.tar")
	if err := run([]string{"finalize", "--in", writeTemp(t, koImage), "--out", out, "--tag", "sluice/epp:v1.2.3",
		"--version", "v1.2.3", "--revision", "abc123"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || !slices.Equal(manifest[0].RepoTags, []string{"sluice/epp:v1.2.3"}) {
		t.Errorf("manifest.json = %+v, want one image tagged sluice/epp:v1.2.3", manifest)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".*")); len(leftovers) != 0 {
		t.Errorf("temporary files left behind: %q", leftovers)
	}
}

func writeTemp(t *testing.T, img v1.Image) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.tar")
	if err := tarball.WriteToFile(path, nil, img); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFinalizeRejectsNonKoEntrypoint(t *testing.T) {
	for _, ep := range [][]string{
		nil,
		{"/usr/bin/epp"},
		{"/ko-app/dlv", "exec", "--", "/ko-app/epp"}, // ko --debug
	} {
		if _, err := finalize(koLikeImage(t, ep), finalizeOptions{version: "v", revision: "r", source: "s"}); err == nil {
			t.Errorf("entrypoint %q: finalize succeeded, want an error", ep)
		}
	}
}

func TestRunReportsMissingFlags(t *testing.T) {
	err := run([]string{"finalize", "--in", "x.tar"}, io.Discard, io.Discard)
	if err == nil {
		t.Fatal("finalize without required flags succeeded")
	}
	for _, flag := range []string{"--out", "--tag", "--version", "--revision"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("error %q does not name %s", err, flag)
		}
	}
	if err := run([]string{"base"}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--cache") {
		t.Errorf("base without --cache: err = %v, want it to name --cache", err)
	}
	if err := run([]string{"bogus"}, io.Discard, io.Discard); err == nil {
		t.Error("unknown subcommand succeeded")
	}
}
