package testenv

import (
	"os"
	"testing"
)

// Golden compares got with the committed file at path, after writing it there when update is
// set (a test's -update flag); regenerate names the command that writes it, for the failure.
func Golden(tb testing.TB, path string, got []byte, update bool, regenerate string) {
	tb.Helper()
	if update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%v (run `%s` to write it)", err, regenerate)
	}
	if string(want) != string(got) {
		tb.Errorf("%s differs from what the code makes: run `%s` and review the diff", path, regenerate)
	}
}
