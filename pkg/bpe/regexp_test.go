package bpe

import (
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The published pre-tokenizer patterns, run by the backtracking engine tiktoken-go uses: the
// reference the hand-written scanners (pretokenize.go) are tested against piece for piece.
var patterns = map[string]string{
	"o200k_base": strings.Join([]string{
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
		`\p{N}{1,3}`,
		` ?[^\s\p{L}\p{N}]+[\r\n/]*`,
		`\s*[\r\n]+`,
		`\s+(?!\S)`,
		`\s+`,
	}, "|"),
	"cl100k_base": `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
}

// regexpSplitter matches the pattern over the text's runes. Text that is not valid UTF-8 is
// read as tiktoken-go reads it: every invalid byte is U+FFFD.
func regexpSplitter(pattern string) splitter {
	re := regexp2.MustCompile(pattern, regexp2.None)
	return func(s string, yield func(string) bool) {
		if !utf8.ValidString(s) {
			s = string([]rune(s))
		}
		runes := []rune(s)
		offsets := make([]int, len(runes)+1) // byte offset of each rune
		at := 0
		for i, r := range runes {
			offsets[i] = at
			at += utf8.RuneLen(r)
		}
		offsets[len(runes)] = at
		m, _ := re.FindRunesMatch(runes)
		for m != nil {
			if !yield(s[offsets[m.Index]:offsets[m.Index+m.Length]]) {
				return
			}
			m, _ = re.FindNextMatch(m)
		}
	}
}
