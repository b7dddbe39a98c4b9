package textdiff

import (
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
