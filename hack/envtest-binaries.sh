#!/usr/bin/env bash
# envtest-binaries.sh builds a real kube-apiserver and etcd from the Go module
# proxy (no binary downloads are reachable from our machines) and prints the
# directory that holds them, suitable for KUBEBUILDER_ASSETS.
#
# The binaries are cached under ${SLUICE_CACHE:-$XDG_CACHE_HOME/sluice} keyed by
# version, so only the first run pays the 4-9 minute cold build.
#
# kube-apiserver: k8s.io/kubernetes cannot be `go get`-ed as a library because
# its go.mod replaces every k8s.io/* staging module with ./staging/...; a
# throwaway wrapper module replaces each of those with the published v0.x.y.
# etcd: built from go.etcd.io/etcd/server/v3 in a second wrapper module.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
cache_root="${SLUICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}"
out="$cache_root/envtest/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}"

if [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]]; then
	echo "$out"
	exit 0
fi
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod
export CGO_ENABLED=0

build_apiserver() {
	local dir="$work/apiserver"
	mkdir -p "$dir"
	cd "$dir"
	cat >go.mod <<GOMOD
module sluice.local/envtest-apiserver

go 1.25
GOMOD
	cat >tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
	# Learn the staging modules from kubernetes' own go.mod, then pin each to
	# the published staging version that matches the release.
	local modfile
	modfile="$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
	local staging="0.${K8S_VERSION#1.}"
	local args=()
	while read -r mod; do
		args+=("-replace=${mod}=${mod}@v${staging}")
	done < <(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile")
	go mod edit "${args[@]}"
	go mod edit -require="k8s.io/kubernetes@v${K8S_VERSION}"
	# kubernetes pins some dependencies with replace directives too; copy the
	# non-staging ones so the build sees the same versions.
	while read -r line; do
		go mod edit "-replace=${line}"
	done < <(sed -n 's#^\s*\([^ ]*\) \(v[^ ]*\) => \([^ .][^ ]*\) \(v[^ ]*\)$#\1@\2=\3@\4#p' "$modfile")
	go mod tidy >/dev/null
	go build -trimpath -ldflags="-s -w" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
}

build_etcd() {
	local dir="$work/etcd"
	mkdir -p "$dir"
	cd "$dir"
	cat >go.mod <<GOMOD
module sluice.local/envtest-etcd

go 1.25
GOMOD
	go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >/dev/null
	cat >tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
	go mod tidy >/dev/null
	go build -trimpath -ldflags="-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
}

echo "building kube-apiserver v${K8S_VERSION} and etcd v${ETCD_VERSION} into $out (first time only, several minutes)" >&2
build_etcd
build_apiserver
echo "$out"
