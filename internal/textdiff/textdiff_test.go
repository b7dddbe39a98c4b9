package textdiff

import (
	"runtime"
	"strings"
	"testing"
)

func TestUnifiedDiff(t *testing.T) {
	for _, tt := range []struct {
		name, a, b, want string
	}{
		{"same", "a\nb", "a\nb", ""},
		{"one line changed", "1\n2\n3\n4\n5\n6\n7\n8\n9", "1\n2\n3\n4\nFIVE\n6\n7\n8\n9",
			"--- A\n+++ B\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+FIVE\n 6\n 7\n 8\n"},
		{"added at the end", "x\ny", "x\ny\nz", "--- A\n+++ B\n@@ -1,2 +1,3 @@\n x\n y\n+z\n"},
		{"two hunks", "a\n1\n2\n3\n4\n5\n6\n7\n8\nb", "A\n1\n2\n3\n4\n5\n6\n7\n8\nB",
			"--- A\n+++ B\n@@ -1,4 +1,4 @@\n-a\n+A\n 1\n 2\n 3\n@@ -7,4 +7,4 @@\n 6\n 7\n 8\n-b\n+B\n"},
	} {
		var b strings.Builder
		Unified(&b, "A", "B", tt.a, tt.b, 3)
		if b.String() != tt.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tt.name, b.String(), tt.want)
		}
	}
}

// TestUnifiedLargeInputsStayBounded: two 1 MiB texts of one-letter lines that share only their
// first and last lines. A full table would be 2.7e11 cells; the diff is one change instead, in
// bounded memory, and still turns one text into the other.
func TestUnifiedLargeInputsStayBounded(t *testing.T) {
	const n = 1 << 19 // lines of 2 bytes: 1 MiB
	a := "head\n" + strings.Repeat("a\n", n) + "tail"
	b := "head\n" + strings.Repeat("b\n", n) + "tail"
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var out strings.Builder
	Unified(&out, "a", "b", a, b, 3)
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 512<<20 {
		t.Errorf("the diff allocated %d MiB", alloc>>20)
	}
	var removed, added int
	for _, l := range strings.Split(out.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "---"), strings.HasPrefix(l, "+++"):
		case l == "-a":
			removed++
		case l == "+b":
			added++
		}
	}
	if removed != n || added != n {
		t.Errorf("removed %d and added %d lines, want %d each", removed, added, n)
	}
	if !strings.Contains(out.String(), "@@ -1,") || !strings.Contains(out.String(), " head\n") || !strings.Contains(out.String(), " tail\n") {
		t.Errorf("the hunk lacks its context:\n%.300s", out.String())
	}
}
