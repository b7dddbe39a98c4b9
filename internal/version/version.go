// Package version says which build a binary is: the module version and the commit it was built
// from, as the Go toolchain records them in every binary built from a git checkout (go build's
// -buildvcs, on by default). Nothing is written by hand, so nothing can drift from the build.
package version

import (
	"fmt"
	"runtime/debug"
)

// String is "<name> <module version> (commit <revision>[, modified], <commit time>, <go version>)";
// a binary built outside a checkout (go run, -buildvcs=false) says its commit is unknown.
func String(name string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return name + " (no build information)"
	}
	var revision, at, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if revision == "" {
		return fmt.Sprintf("%s %s (commit unknown: built without version control information, %s)", name, info.Main.Version, info.GoVersion)
	}
	return fmt.Sprintf("%s %s (commit %s%s, %s, %s)", name, info.Main.Version, revision, modified, at, info.GoVersion)
}
