package console

import "unicode/utf8"

// Bounds of what a page shows of one text: longer texts are cut, at a character boundary, with
// a link to the whole text served as text/plain.
const (
	previewBytes = 600       // a submission's preview on the execution page
	shownBytes   = 64 << 10  // a submission, feedback or template shown whole on its page
	promptBytes  = 512 << 10 // a prompt: whole up to half the default event limit
	diffBytes    = 256 << 10 // a diff's output
)

// clipped is a text as a page shows it.
type clipped struct {
	Text  string
	Cut   bool
	Total int // bytes of the whole text
}

// clip keeps at most n bytes of s, never splitting a character.
func clip(s string, n int) clipped {
	if len(s) <= n {
		return clipped{Text: s, Total: len(s)}
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return clipped{Text: s[:i], Cut: true, Total: len(s)}
}
