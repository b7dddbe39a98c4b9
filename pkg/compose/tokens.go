package compose

import (
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/pkoukk/tiktoken-go"
	loader "github.com/pkoukk/tiktoken-go-loader"
)

// TokenCounter estimates how many tokens a model will see in a prompt.
type TokenCounter interface {
	Count(s string) int
	Name() string
}

// Encodings lists what NewTokenCounter knows. The BPE ones are real tokenizers whose ranks are
// compiled into the binary (tiktoken-go-loader's offline loader): nothing is downloaded at run time.
func Encodings() []string { return []string{"o200k_base", "cl100k_base", approxName} }

const approxName = "approx-cjk-v1"

// tiktoken-go keeps its loader in a package variable; setting it once, before the first
// encoding is built, keeps it from ever reaching for the network.
var setOfflineLoader sync.Once

// NewTokenCounter returns the counter of the named encoding.
func NewTokenCounter(name string) (TokenCounter, error) {
	if name == approxName {
		return approxCounter{}, nil
	}
	setOfflineLoader.Do(func() { tiktoken.SetBpeLoader(loader.NewOfflineLoader()) })
	enc, err := tiktoken.GetEncoding(name)
	if err != nil {
		return nil, fmt.Errorf("compose: token encoding %q: %w (known: %v)", name, err, Encodings())
	}
	return &bpeCounter{enc: enc, name: name, cache: map[string]int{}}, nil
}

// bpeCounter counts with a BPE tokenizer. Special-token text in a prompt ("<|endoftext|>" in a
// submission) is counted as the ordinary text it is, never as a control token.
//
// Encoding is the composer's hottest step (the pre-tokenizer is a backtracking regexp), and
// prompts of one tournament repeat most of their lines: the template's, the leaderboard's, a
// team's earlier rounds, and every line again on each step of a budget search. So the text is
// cut into lines where the encoding's own pre-tokenizer always cuts, and each line's count is
// remembered. The sum equals the count of the whole text exactly (TestBPECountIsExact).
type bpeCounter struct {
	enc  *tiktoken.Tiktoken
	name string

	mu    sync.Mutex
	cache map[string]int
}

// maxCachedLines bounds the memory of the line cache (about 64k lines of a few hundred bytes).
const maxCachedLines = 1 << 16

func (c *bpeCounter) Name() string { return c.name }

func (c *bpeCounter) Count(s string) int {
	total, start := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' && splitsAfter(s, i) {
			total += c.line(s[start : i+1])
			start = i + 1
		}
	}
	return total + c.line(s[start:])
}

// splitsAfter reports whether every pre-tokenizer piece ends at the newline s[i]: the character
// before it is not whitespace (no whitespace run spans the newline) and the one after it is
// neither whitespace nor '/' (punctuation pieces may absorb newlines and slashes that follow).
// Both o200k_base's and cl100k_base's patterns start a new piece there.
func splitsAfter(s string, i int) bool {
	if i == 0 || i+1 >= len(s) {
		return false
	}
	before, _ := utf8.DecodeLastRuneInString(s[:i])
	after, _ := utf8.DecodeRuneInString(s[i+1:])
	return !unicode.IsSpace(before) && !unicode.IsSpace(after) && after != '/'
}

func (c *bpeCounter) line(s string) int {
	if s == "" {
		return 0
	}
	c.mu.Lock()
	n, ok := c.cache[s]
	c.mu.Unlock()
	if ok {
		return n
	}
	n = len(c.enc.EncodeOrdinary(s))
	c.mu.Lock()
	if len(c.cache) >= maxCachedLines {
		clear(c.cache)
	}
	c.cache[s] = n
	c.mu.Unlock()
	return n
}

// approxCounter is the documented deterministic approximation: every CJK character (Han,
// Hiragana, Katakana, Hangul) is one token, and every other run of text costs one token per four
// bytes, rounded up.
type approxCounter struct{}

func (approxCounter) Name() string { return approxName }

func (approxCounter) Count(s string) int {
	tokens, run := 0, 0
	for _, r := range s {
		// Below U+1100 (the first Hangul jamo) no rune is in these scripts: skip the table walk.
		if r >= 0x1100 && unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul) {
			tokens += (run+3)/4 + 1
			run = 0
			continue
		}
		run += utf8.RuneLen(r)
	}
	return tokens + (run+3)/4
}
