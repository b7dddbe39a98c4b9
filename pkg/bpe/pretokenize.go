package bpe

import (
	"unicode"
	"unicode/utf8"
)

// splitter cuts a text into the pieces the encoding's pre-tokenizer makes and hands each to
// yield, in order, until yield returns false.
type splitter func(s string, yield func(piece string) bool)

var splitters = map[string]func() splitter{
	"o200k_base":  func() splitter { return scan(nextO200k) },
	"cl100k_base": func() splitter { return scan(nextCl100k) },
}

// The pre-tokenizers are written out by hand: each encoding publishes its as a regular
// expression, which a backtracking engine runs a hundred times slower than this. Every
// alternative below is one of the pattern's, tried in the pattern's order, with the same greedy
// choices and the backtracking they imply; the classes are Go's unicode tables, as the regexp
// engine tiktoken-go uses reads them (\s is unicode.IsSpace). TestScannersMatchThePatterns checks
// them piece for piece against the patterns themselves.

// scan runs next from the start of s to its end. Text that is not valid UTF-8 is read as
// tiktoken-go reads it: every invalid byte is U+FFFD.
func scan(next func(s string, i int) int) splitter {
	return func(s string, yield func(string) bool) {
		if !utf8.ValidString(s) {
			s = string([]rune(s))
		}
		for i := 0; i < len(s); {
			end := next(s, i)
			if !yield(s[i:end]) {
				return
			}
			i = end
		}
	}
}

// Character classes of the patterns, as bits.
const (
	cL    = 1 << iota // \p{L}
	cN                // \p{N}
	cUp               // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]: o200k's upper-case side
	cLow              // [\p{Ll}\p{Lm}\p{Lo}\p{M}]: o200k's lower-case side
	cS                // \s
	cCRLF             // [\r\n]
)

// asciiClass holds the classes of the ASCII characters, the common case.
var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for r := range rune(utf8.RuneSelf) {
		t[r] = classOf(r)
	}
	return t
}()

func classOf(r rune) uint8 {
	var c uint8
	switch {
	case unicode.IsLetter(r):
		c |= cL
		if unicode.Is(unicode.Ll, r) {
			c |= cLow
		} else if unicode.In(r, unicode.Lm, unicode.Lo) {
			c |= cUp | cLow
		} else {
			c |= cUp // Lu, Lt
		}
	case unicode.IsNumber(r):
		c |= cN
	case unicode.IsMark(r):
		c |= cUp | cLow
	case unicode.IsSpace(r):
		c |= cS
		if r == '\r' || r == '\n' {
			c |= cCRLF
		}
	}
	return c
}

// at returns the classes and size of the rune at s[i]; s is valid UTF-8.
func at(s string, i int) (uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classOf(r), n
}

// run returns the end of the longest run from i of runes having any class of want.
func run(s string, i int, want uint8) int {
	for i < len(s) {
		c, n := at(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// prefixEnd is where an optional [^\r\n\p{L}\p{N}] at i ends: -1 when s[i] is not one.
func prefixEnd(s string, i int) int {
	if c, n := at(s, i); c&(cCRLF|cL|cN) == 0 {
		return i + n
	}
	return -1
}

// punct reports whether the class is [^\s\p{L}\p{N}].
func punct(c uint8) bool { return c&(cS|cL|cN) == 0 }

// contraction returns the end of (?i:'s|'t|'re|'ve|'m|'ll|'d) at i, or i.
func contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return i
	}
	lower := func(b byte) byte { return b | 0x20 }
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return i + 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return i + 3
		}
	}
	return i
}

// digits is \p{N}{1,3} at i: its end, or -1.
func digits(s string, i int) int {
	end := i
	for k := 0; k < 3 && end < len(s); k++ {
		c, n := at(s, end)
		if c&cN == 0 {
			break
		}
		end += n
	}
	if end == i {
		return -1
	}
	return end
}

// punctuation is ` ?[^\s\p{L}\p{N}]+` followed by a run of trail classes (or trail bytes): its
// end, or -1.
func punctuation(s string, i int, trailSlash bool) int {
	for _, start := range [2]int{i + 1, i} { // the optional space first, as greedy ? tries
		if start == i+1 && s[i] != ' ' || start >= len(s) {
			continue
		}
		end := start
		for end < len(s) {
			c, n := at(s, end)
			if !punct(c) {
				break
			}
			end += n
		}
		if end == start {
			continue
		}
		for end < len(s) && (s[end] == '\r' || s[end] == '\n' || trailSlash && s[end] == '/') {
			end++
		}
		return end
	}
	return -1
}

// whitespace is the three space alternatives both patterns end with: \s*[\r\n]+, \s+(?!\S),
// \s+. s[i] is whitespace.
func whitespace(s string, i int) int {
	end, lastCRLF := i, -1
	for end < len(s) {
		c, n := at(s, end)
		if c&cS == 0 {
			break
		}
		if c&cCRLF != 0 {
			lastCRLF = end + n
		}
		end += n
	}
	switch {
	case lastCRLF >= 0:
		return lastCRLF // \s*[\r\n]+ backtracks to the last line break of the run
	case end == len(s):
		return end // \s+(?!\S) at the end of the text
	}
	_, last := utf8.DecodeLastRuneInString(s[i:end])
	if end-last > i {
		return end - last // \s+(?!\S): all but the last, which the next piece takes
	}
	return end // \s+
}

// nextO200k is the end of the piece at i under o200k_base's pattern.
func nextO200k(s string, i int) int {
	// [^\r\n\p{L}\p{N}]?[Up]*[Low]+('s|...)? : the prefix taken first; Up* greedy, then backtracked
	// to the last rune that is also Low when the rune after the run is not.
	for _, start := range [2]int{prefixEnd(s, i), i} {
		if start < 0 || start >= len(s) {
			continue
		}
		e, lastLow := start, -1
		for e < len(s) {
			c, n := at(s, e)
			if c&cUp == 0 {
				break
			}
			if c&cLow != 0 {
				lastLow = e + n
			}
			e += n
		}
		if e < len(s) {
			if c, _ := at(s, e); c&cLow != 0 {
				return contraction(s, run(s, e, cLow))
			}
		}
		if lastLow >= 0 {
			return contraction(s, lastLow)
		}
	}
	// [^\r\n\p{L}\p{N}]?[Up]+[Low]*('s|...)?
	for _, start := range [2]int{prefixEnd(s, i), i} {
		if start < 0 || start >= len(s) {
			continue
		}
		if e := run(s, start, cUp); e > start {
			return contraction(s, run(s, e, cLow))
		}
	}
	if end := digits(s, i); end >= 0 {
		return end
	}
	if end := punctuation(s, i, true); end >= 0 {
		return end
	}
	return whitespace(s, i)
}

// nextCl100k is the end of the piece at i under cl100k_base's pattern.
func nextCl100k(s string, i int) int {
	if end := contraction(s, i); end > i {
		return end
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	for _, start := range [2]int{prefixEnd(s, i), i} {
		if start < 0 || start >= len(s) {
			continue
		}
		if e := run(s, start, cL); e > start {
			return e
		}
	}
	if end := digits(s, i); end >= 0 {
		return end
	}
	if end := punctuation(s, i, false); end >= 0 {
		return end
	}
	return whitespace(s, i)
}
