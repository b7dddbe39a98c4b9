package console

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want clipped
	}{
		{"short", 10, clipped{Text: "short", Total: 5}},
		{"exactly10!", 10, clipped{Text: "exactly10!", Total: 10}},
		{"abcdefghijk", 10, clipped{Text: "abcdefghij", Cut: true, Total: 11}},
		// 日 is 3 bytes: a cut inside it keeps the characters before it whole.
		{"ab日本", 4, clipped{Text: "ab", Cut: true, Total: 8}},
		{"", 3, clipped{}},
	} {
		if got := clip(tt.in, tt.n); got != tt.want {
			t.Errorf("clip(%q, %d) = %+v, want %+v", tt.in, tt.n, got, tt.want)
		}
	}
	big := strings.Repeat("é", 600_000) // 1.2 MB
	c := clip(big, shownBytes)
	if !c.Cut || len(c.Text) > shownBytes || !utf8.ValidString(c.Text) || c.Total != len(big) {
		t.Errorf("a 1.2 MB text clipped to %d bytes, cut %v, valid %v", len(c.Text), c.Cut, utf8.ValidString(c.Text))
	}
}
