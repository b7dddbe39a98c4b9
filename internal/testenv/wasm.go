package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildWasm builds the Go command in dir (a package path, relative to the test's folder, like
// "./testdata/loop") as a WASI preview 1 module and returns its bytes: what an author of a prompt
// builder does (docs/builders.md).
func BuildWasm(tb testing.TB, dir string) []byte {
	tb.Helper()
	return buildGo(tb, dir)
}

// BuildWasmReactor builds the Go package in dir as a WASI reactor (GOOS=wasip1,
// -buildmode=c-shared: its runtime starts once, at _initialize, and podium_run is called after),
// and returns the module's bytes.
func BuildWasmReactor(tb testing.TB, dir string) []byte {
	tb.Helper()
	return buildGo(tb, dir, "-buildmode=c-shared")
}

func buildGo(tb testing.TB, dir string, flags ...string) []byte {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), filepath.Base(dir)+".wasm")
	cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", out, dir)...)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building %s for wasip1: %v\n%s", dir, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// BuildC builds a builder written in C with the build.sh beside its source in dir (Debian's clang
// and wasi-libc: docs/builders.md), and returns the module's bytes.
func BuildC(tb testing.TB, dir string) []byte {
	tb.Helper()
	return buildScript(tb, dir)
}

// BuildRust builds a builder written in Rust with the build.sh beside its source in dir (Debian's
// rustc and its wasm32 standard library: docs/builders.md), and returns the module's bytes.
func BuildRust(tb testing.TB, dir string) []byte {
	tb.Helper()
	return buildScript(tb, dir)
}

func buildScript(tb testing.TB, dir string) []byte {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), filepath.Base(dir)+".wasm")
	if msg, err := exec.Command(filepath.Join(dir, "build.sh"), out).CombinedOutput(); err != nil {
		tb.Fatalf("building %s: %v\n%s", dir, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
