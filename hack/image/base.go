package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// nonrootID is distroless's "nonroot" user and group, which the upstream
	// EPP image (gcr.io/distroless/static:nonroot) runs as.
	nonrootID = 65532
	// nonrootUser is the numeric user:group for image configs; numeric so
	// Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
	nonrootUser = "65532:65532"

	// caBundlePath is where Debian, distroless and Go's crypto/x509 look
	// for the system roots (without the leading slash: tar entry names).
	caBundlePath = "etc/ssl/certs/ca-certificates.crt"

	// defaultBaseRepo names the base in its digest reference. ko only needs
	// the digest (it looks that up in $KOCACHE/img); .invalid (RFC 2606)
	// guarantees a cache miss fails fast instead of pulling something else.
	defaultBaseRepo = "sluice.invalid/epp-base"

	// koCacheImageDir is the OCI layout ko v0.18.0 reads base images from,
	// relative to $KOCACHE (pkg/commands/cache.go, newCache).
	koCacheImageDir = "img"
)

// fixedTime stamps every file, the config and the history, so the base's
// digest depends only on its contents.
var fixedTime = time.Unix(0, 0).UTC()

// Contents of the base's account files, matching distroless static's
// nonroot variant: root, nobody and nonroot, none with a login shell (there
// is none in the image).
const (
	etcGroup  = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
	etcPasswd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	// Go's resolver reads this to order /etc/hosts before DNS.
	etcNsswitch = "hosts: files dns\n"
)

func runBase(args []string, stdout, stderr io.Writer) error {
	flags := newFlagSet("base", stderr)
	cacheDir := flags.String("cache", "", "ko cache directory ($KOCACHE); the base is written to its img/ OCI layout")
	caBundle := flags.String("ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "PEM CA bundle copied into the image")
	repo := flags.String("repo", defaultBaseRepo, "repository part of the printed digest reference")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if err := requireFlags(flags, "cache"); err != nil {
		return err
	}
	if flags.NArg() != 0 {
		return fmt.Errorf("base: unexpected arguments %q", flags.Args())
	}
	ca, err := readCABundle(*caBundle)
	if err != nil {
		return err
	}
	img, err := buildBase(ca)
	if err != nil {
		return fmt.Errorf("assembling base: %w", err)
	}
	ref, err := storeBase(filepath.Join(*cacheDir, koCacheImageDir), *repo, img)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, ref.String())
	return nil
}

// readCABundle reads and sanity-checks the CA bundle: an image without
// usable roots would fail every TLS handshake only at run time.
func readCABundle(path string) ([]byte, error) {
	pem, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("CA bundle %s not found: install the ca-certificates package (Debian/Ubuntu: apt-get install ca-certificates) or pass --ca-bundle", path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading CA bundle: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s contains no PEM certificates", path)
	}
	return pem, nil
}

// buildBase returns a single-layer linux/amd64 OCI image holding the CA
// bundle, the nonroot user and the directories distroless provides. It is
// deterministic: equal caBundle bytes give equal digests.
func buildBase(caBundle []byte) (v1.Image, error) {
	layerTar, err := baseLayerTar(caBundle)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: fixedTime},
		// The OCI image spec requires "layers"; mutate.Append fills in
		// only the diff IDs.
		RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{
			User: nonrootUser,
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"SSL_CERT_FILE=/" + caBundlePath,
			},
			WorkingDir: "/",
		},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: fixedTime},
			CreatedBy: "sluice hack/image base",
			Comment:   "CA bundle, passwd/group with nonroot (65532), /home/nonroot, /tmp; no shell",
		},
	})
}

// baseLayerTar writes the base's only layer. Entries are in a fixed order,
// parents first, with fixed owners, modes and times.
func baseLayerTar(caBundle []byte) ([]byte, error) {
	type entry struct {
		name    string // directories end in "/"
		mode    int64
		owner   int // uid and gid
		content string
	}
	entries := []entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, content: etcGroup},
		{name: "etc/nsswitch.conf", mode: 0o644, content: etcNsswitch},
		{name: "etc/passwd", mode: 0o644, content: etcPasswd},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: caBundlePath, mode: 0o644, content: string(caBundle)},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, owner: nonrootID},
		{name: "root/", mode: 0o700},
		// Sticky and world-writable, as on any Linux root filesystem.
		{name: "tmp/", mode: 0o1777},
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg, Name: e.name, Mode: e.mode, Size: int64(len(e.content)),
			Uid: e.owner, Gid: e.owner, ModTime: fixedTime, Format: tar.FormatUSTAR,
		}
		if strings.HasSuffix(e.name, "/") {
			hdr.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("writing base layer: %w", err)
		}
		if _, err := io.WriteString(tw, e.content); err != nil {
			return nil, fmt.Errorf("writing base layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing base layer: %w", err)
	}
	return buf.Bytes(), nil
}

// storeBase makes img available in the OCI layout at layoutDir and returns
// its digest reference under repo. The layout is only written when img is
// missing or one of its blobs is, so warm runs leave it untouched.
func storeBase(layoutDir, repo string, img v1.Image) (name.Digest, error) {
	digest, err := img.Digest()
	if err != nil {
		return name.Digest{}, err
	}
	ref, err := name.NewDigest(repo + "@" + digest.String())
	if err != nil {
		return name.Digest{}, fmt.Errorf("base reference: %w", err)
	}

	p, err := layout.FromPath(layoutDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if p, err = layout.Write(layoutDir, empty.Index); err != nil {
			return name.Digest{}, fmt.Errorf("creating OCI layout %s: %w", layoutDir, err)
		}
	case err != nil:
		return name.Digest{}, fmt.Errorf("opening OCI layout %s: %w", layoutDir, err)
	}

	listed, err := layoutLists(p, digest)
	if err != nil {
		return name.Digest{}, err
	}
	bad, err := incompleteBlobs(p, img)
	if err != nil {
		return name.Digest{}, err
	}
	if listed && len(bad) == 0 {
		return ref, nil
	}
	// layout skips blobs that already exist (at any size for the manifest),
	// so a cut-short blob has to go before it can be rewritten.
	for _, b := range bad {
		if err := os.Remove(blobPath(p, b.Digest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return name.Digest{}, fmt.Errorf("removing incomplete blob: %w", err)
		}
	}
	// ReplaceImage rather than AppendImage: an entry whose blobs went
	// missing is rewritten instead of duplicated in index.json.
	if err := p.ReplaceImage(img, match.Digests(digest), layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.String(),
	})); err != nil {
		return name.Digest{}, fmt.Errorf("writing base to OCI layout %s: %w", layoutDir, err)
	}
	return ref, nil
}

// layoutLists reports whether p's index has an entry for digest, the
// lookup ko does before it would pull.
func layoutLists(p layout.Path, digest v1.Hash) (bool, error) {
	index, err := p.ImageIndex()
	if err != nil {
		return false, fmt.Errorf("reading OCI layout index: %w", err)
	}
	found, err := partial.FindManifests(index, match.Digests(digest))
	if err != nil {
		return false, fmt.Errorf("reading OCI layout index: %w", err)
	}
	return len(found) != 0, nil
}

// incompleteBlobs returns the blobs of img ko will read (manifest, config,
// layers) that p lacks or holds at the wrong size, e.g. after an
// interrupted write.
func incompleteBlobs(p layout.Path, img v1.Image) ([]v1.Descriptor, error) {
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	manifestSize, err := img.Size()
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	var bad []v1.Descriptor
	for _, d := range append([]v1.Descriptor{{Digest: digest, Size: manifestSize}, m.Config}, m.Layers...) {
		info, err := os.Stat(blobPath(p, d.Digest))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			bad = append(bad, d)
		case err != nil:
			return nil, fmt.Errorf("checking blob %s: %w", d.Digest, err)
		case !info.Mode().IsRegular() || info.Size() != d.Size:
			bad = append(bad, d)
		}
	}
	return bad, nil
}

// blobPath is fixed by the OCI image layout spec: blobs/<algorithm>/<hex>.
func blobPath(p layout.Path, h v1.Hash) string {
	return filepath.Join(string(p), "blobs", h.Algorithm, h.Hex)
}
