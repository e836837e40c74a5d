package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/workload-ca/workload-ca/metrics"
)

// build is what the binary knows of its build: the version set at link
// time, and the VCS revision, commit time and Go version the toolchain
// stamped.
type build struct {
	version, revision, time, goVersion string
	modified                           bool
}

func readBuild() build {
	b := build{version: version, revision: "unknown", goVersion: runtime.Version()}
	if revision != "" {
		b.revision, b.time = revision, commitTime
		return b
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.time":
			b.time = s.Value
		case "vcs.modified":
			b.modified = s.Value == "true"
		}
	}
	return b
}

// String is the version line: version, commit, its date, Go version.
func (b build) String() string {
	rev := b.revision
	if b.modified {
		rev += "-dirty"
	}
	s := fmt.Sprintf("workload-ca %s (commit %s", b.version, rev)
	if b.time != "" {
		s += ", " + b.time
	}
	return s + ", " + b.goVersion + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}

// metrics is the build as workload_ca_build_info labels it.
func (b build) metrics() metrics.BuildInfo {
	return metrics.BuildInfo{Version: b.version, Revision: b.revision, GoVersion: b.goVersion}
}
