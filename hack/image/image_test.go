package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Environment set by `make image-test` (hack/image.mk).
const (
	envTarball  = "SLUICE_IMAGE_TARBALL"  // the image to inspect
	envVersion  = "SLUICE_IMAGE_VERSION"  // expected version label, tag and --version output
	envRevision = "SLUICE_IMAGE_REVISION" // expected revision label and --version output
)

// TestImage inspects the shipped image tarball. Expected values are spelled
// out here rather than taken from finalize.go, so a wrong constant there
// fails this test instead of passing it.
func TestImage(t *testing.T) {
	tarballPath := os.Getenv(envTarball)
	if tarballPath == "" {
		if testing.Short() {
			t.Skip(envTarball + " is not set; image checks skipped in -short mode (run `make image-test`)")
		}
		t.Fatal(envTarball + " is not set: this test inspects a built image. Run `make image-test`, " +
			"or set it to a tarball from `make image`; use -short to skip it.")
	}
	version, revision := os.Getenv(envVersion), os.Getenv(envRevision)

	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarballPath) })
	if err != nil {
		t.Fatalf("%s is not a docker-loadable tarball: %v", tarballPath, err)
	}
	if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 {
		t.Fatalf("manifest.json = %+v, want one image with one tag", manifest)
	}
	if tag := manifest[0].RepoTags[0]; version != "" && !strings.HasSuffix(tag, ":"+version) {
		t.Errorf("tag = %q, want it tagged %q", tag, version)
	}

	img, err := tarball.ImageFromPath(tarballPath, nil)
	if err != nil {
		t.Fatalf("loading %s: %v", tarballPath, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, cf, version, revision)

	files := flatten(t, img)
	checkNonrootBase(t, files)

	t.Run("epp binary", func(t *testing.T) {
		target, bin := resolve(t, files, "/epp")
		if bin.hdr.Mode&0o001 == 0 {
			t.Errorf("%s mode = %o: not executable by user 65532 (neither its owner nor group)", target, bin.hdr.Mode)
		}
		checkStaticAMD64(t, target, bin.data)
		checkVersionOutput(t, bin.data, version, revision)
	})
}

func checkConfig(t *testing.T, cf *v1.ConfigFile, version, revision string) {
	t.Helper()
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform = %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if cf.RootFS.Type != "layers" {
		t.Errorf("rootfs.type = %q, want \"layers\" (OCI image spec)", cf.RootFS.Type)
	}
	if got := cf.Config.Entrypoint; !slices.Equal(got, []string{"/epp"}) {
		t.Errorf("entrypoint = %q, want [\"/epp\"]", got)
	}
	if len(cf.Config.Cmd) != 0 {
		t.Errorf("cmd = %q, want none (arguments come from the Deployment, as upstream)", cf.Config.Cmd)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user = %q, want numeric non-root 65532:65532", cf.Config.User)
	}
	var ports []string
	for p := range cf.Config.ExposedPorts {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	if want := []string{"9002/tcp", "9003/tcp", "9090/tcp"}; !slices.Equal(ports, want) {
		t.Errorf("exposed ports = %q, want %q", ports, want)
	}
	labels := cf.Config.Labels
	if labels["org.opencontainers.image.source"] == "" {
		t.Errorf("label org.opencontainers.image.source is missing (labels %v)", labels)
	}
	for key, want := range map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
	} {
		switch got := labels[key]; {
		case got == "":
			t.Errorf("label %s is missing (labels %v)", key, labels)
		case want != "" && got != want:
			t.Errorf("label %s = %q, want %q", key, got, want)
		}
	}
}

// checkNonrootBase checks what the base layer must provide, whichever
// image it ends up in.
func checkNonrootBase(t *testing.T, files map[string]fsEntry) {
	t.Helper()
	ca, ok := files["/etc/ssl/certs/ca-certificates.crt"]
	switch {
	case !ok || ca.hdr.Typeflag != tar.TypeReg:
		t.Error("CA bundle /etc/ssl/certs/ca-certificates.crt is missing")
	case !x509.NewCertPool().AppendCertsFromPEM(ca.data):
		t.Error("CA bundle /etc/ssl/certs/ca-certificates.crt holds no certificates")
	}
	for file, line := range map[string]string{
		"/etc/passwd": "nonroot:x:65532:65532:",
		"/etc/group":  "nonroot:x:65532:",
	} {
		if !strings.Contains("\n"+string(files[file].data), "\n"+line) {
			t.Errorf("%s has no %q entry:\n%s", file, line, files[file].data)
		}
	}
	if home, ok := files["/home/nonroot"]; !ok || home.hdr.Typeflag != tar.TypeDir || home.hdr.Uid != 65532 {
		t.Errorf("/home/nonroot is missing or not a directory owned by 65532: %+v", home.hdr)
	}
	for p := range files {
		switch path.Base(p) {
		case "sh", "bash", "dash", "ash", "busybox":
			t.Errorf("image contains a shell: %s", p)
		}
	}
}

// checkStaticAMD64 fails unless data is an x86-64 ELF executable with no
// program interpreter and no shared-library dependencies, i.e. one that
// runs on a base without libc.
func checkStaticAMD64(t *testing.T, name string, data []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s is not an ELF file: %v", name, err)
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		t.Errorf("%s is %v/%v, want ELFCLASS64/EM_X86_64", name, f.Class, f.Machine)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		t.Errorf("%s ELF type = %v, want an executable", name, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a PT_INTERP program header: dynamically linked (built with cgo?)", name)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatalf("%s: reading dynamic section: %v", name, err)
	}
	if len(libs) != 0 {
		t.Errorf("%s needs shared libraries %q", name, libs)
	}
}

// checkVersionOutput runs the binary with --version and looks for the
// version and commit the Makefile passed in through ldflags.
func checkVersionOutput(t *testing.T, binary []byte, version, revision string) {
	t.Helper()
	if version == "" || revision == "" {
		t.Logf("%s or %s not set: --version output not checked", envVersion, envRevision)
		return
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Logf("host is %s/%s: cannot run the linux/amd64 binary to check --version", runtime.GOOS, runtime.GOARCH)
		return
	}
	exe := filepath.Join(t.TempDir(), "epp")
	if err := os.WriteFile(exe, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	// A deadline so a binary that ignores --version and starts serving
	// fails the test instead of hanging it; not a performance bound.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, exe, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("/epp --version: %v\n%s", err, out)
	}
	for _, want := range []string{version, revision} {
		if !strings.Contains(string(out), want) {
			t.Errorf("/epp --version output lacks %q (ldflags not applied?):\n%s", want, out)
		}
	}
}

// fsEntry is one path of an image's flattened filesystem.
type fsEntry struct {
	hdr  *tar.Header
	data []byte // contents of regular files
}

// flatten returns img's filesystem as the runtime sees it (later layers
// win, whiteouts applied), keyed by absolute clean path.
func flatten(t *testing.T, img v1.Image) map[string]fsEntry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]fsEntry{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("reading image filesystem: %v", err)
		}
		e := fsEntry{hdr: hdr}
		if hdr.Typeflag == tar.TypeReg {
			if e.data, err = io.ReadAll(tr); err != nil {
				t.Fatalf("reading %s: %v", hdr.Name, err)
			}
		}
		files[path.Clean("/"+hdr.Name)] = e
	}
}

// resolve follows symlinks from p inside files, as the kernel would inside
// the container, and returns the final path and its regular-file entry.
func resolve(t *testing.T, files map[string]fsEntry, p string) (string, fsEntry) {
	t.Helper()
	const maxHops = 8
	for range maxHops {
		e, ok := files[p]
		if !ok {
			t.Fatalf("%s does not exist in the image", p)
		}
		switch e.hdr.Typeflag {
		case tar.TypeReg:
			return p, e
		case tar.TypeSymlink:
			if target := e.hdr.Linkname; path.IsAbs(target) {
				p = path.Clean(target)
			} else {
				p = path.Join(path.Dir(p), target)
			}
		default:
			t.Fatalf("%s is not a regular file or symlink (type %q)", p, e.hdr.Typeflag)
		}
	}
	t.Fatalf("more than %d symlinks resolving %s", maxHops, p)
	return "", fsEntry{}
}
