// Command image assembles Sluice's EPP container image without Docker.
//
// Why it exists: the build machines have no Docker and no registry access
// except the Go module proxy, so neither `docker build` nor ko's default
// base image (cgr.dev/chainguard/static, pulled from a registry) is usable.
// ko can still build offline when its base is referenced by digest and that
// image already sits in the OCI layout ko keeps under $KOCACHE/img
// (ko v0.18.0, pkg/commands/cache.go: a name.Digest reference is looked up
// in that layout's index.json by digest before any network call). This
// program supplies that base and post-processes ko's output into the image
// we ship. `make image` (hack/image.mk) drives it:
//
//	go run ./hack/image base --cache "$KOCACHE"
//	    Builds a distroless-style static base (CA bundle copied from the
//	    build machine, /etc/passwd and /etc/group with the nonroot user
//	    65532, /home/nonroot, /tmp, no shell), writes it into
//	    $KOCACHE/img and prints its digest reference for
//	    KO_DEFAULTBASEIMAGE.
//	ko build ./cmd/epp --push=false --tarball=...
//	go run ./hack/image finalize --in ko.tar --out bin/sluice-epp-image.tar ...
//	    Adds /epp (a symlink to ko's /ko-app/epp) and sets the config the
//	    upstream EPP image has: entrypoint ["/epp"], user 65532:65532,
//	    exposed ports 9002/tcp (ext-proc gRPC), 9003/tcp (gRPC health),
//	    9090/tcp (metrics), OCI labels. Output is a `docker load`-able
//	    tarball (go-containerregistry tarball.Write format).
//
// Invariants: the base is a pure function of the CA bundle bytes (fixed
// timestamps, ownership and entry order), so its digest is stable across
// runs and machines with the same bundle; finalize only appends a layer and
// rewrites the config, never touching ko's layers; outputs are written to a
// temporary file and renamed, so an interrupted run never leaves a truncated
// tarball behind.
//
// Concurrency: single-threaded. `base` only writes into $KOCACHE/img when
// the base is missing or incomplete there, so concurrent warm runs only read
// the layout; two cold runs racing on one KOCACHE may rewrite index.json at
// the same time and should be avoided.
//
// image_test.go inspects a built tarball (SLUICE_IMAGE_TARBALL, set by
// `make image-test`); base_test.go checks the base assembly on its own.
package main
