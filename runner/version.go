package runner

import (
	"fmt"
	"runtime/debug"

	gieversion "sigs.k8s.io/gateway-api-inference-extension/version"
)

// version and commit are set at link time:
//
//	-ldflags "-X github.com/sluice-gw/sluice/runner.version=v0.1.0 -X github.com/sluice-gw/sluice/runner.commit=abc123"
var (
	version = "dev"
	commit  = ""
)

// VersionInfo describes the build of this binary.
type VersionInfo struct {
	Version    string // Sluice version
	Commit     string // Sluice source commit
	GIEVersion string // the GIE release the EPP is built on
}

// Version returns the build information. When the commit was not set at link
// time it falls back to the VCS revision the Go toolchain recorded, if any.
func Version() VersionInfo {
	info := VersionInfo{Version: version, Commit: commit, GIEVersion: gieversion.BundleVersion}
	if info.Commit == "" {
		info.Commit = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					info.Commit = s.Value
				}
			}
		}
	}
	return info
}

func (v VersionInfo) String() string {
	return fmt.Sprintf("sluice-epp %s (commit %s), built on gateway-api-inference-extension %s", v.Version, v.Commit, v.GIEVersion)
}
