package compose

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/podium-llm/podium/pkg/bpe"
)

// TokenCounter estimates how many tokens a model will see in a prompt. Counting may take long
// on hostile text, so it stops with its context.
type TokenCounter interface {
	Count(ctx context.Context, s string) (int, error)
	Name() string
}

// Encodings lists what NewTokenCounter knows. The BPE ones are exact counts (pkg/bpe) over rank
// tables compiled into the binary: nothing is downloaded at run time.
func Encodings() []string { return append(bpe.Names(), approxName) }

const approxName = "approx-cjk-v1"

// NewTokenCounter returns the counter of the named encoding.
func NewTokenCounter(name string) (TokenCounter, error) {
	if name == approxName {
		return approxCounter{}, nil
	}
	enc, err := bpe.Load(name)
	if err != nil {
		return nil, fmt.Errorf("compose: token encoding %q: %w (known: %v)", name, err, Encodings())
	}
	return &bpeCounter{enc: enc, name: name, cache: map[string]int{}}, nil
}

// bpeCounter counts with a BPE tokenizer. Special-token text in a prompt ("<|endoftext|>" in a
// submission) is counted as the ordinary text it is, never as a control token.
//
// Encoding is the composer's hottest step, and prompts of one tournament repeat most of their lines: the template's, the leaderboard's, a
// team's earlier rounds, and every line again on each step of a budget search. So the text is
// cut into lines where the encoding's own pre-tokenizer always cuts, and each line's count is
// remembered. The sum equals the count of the whole text exactly (TestBPECountIsExact).
type bpeCounter struct {
	enc  *bpe.Encoding
	name string

	mu    sync.Mutex
	cache map[string]int
	// cachedBytes is the size of the cache's keys.
	cachedBytes int
}

// The line cache is bounded in lines and in bytes; its keys are copies, so a cached line never
// keeps the prompt it was cut from alive.
const (
	maxCachedLines     = 1 << 16
	maxCachedBytes     = 16 << 20
	maxCachedLineBytes = 4 << 10
)

func (c *bpeCounter) Name() string { return c.name }

func (c *bpeCounter) Count(ctx context.Context, s string) (int, error) {
	total, start := 0, 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && (s[i] != '\n' || !splitsAfter(s, i)) {
			continue
		}
		end := min(i+1, len(s))
		n, err := c.line(ctx, s[start:end])
		if err != nil {
			return 0, err
		}
		total, start = total+n, end
	}
	return total, nil
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

func (c *bpeCounter) line(ctx context.Context, s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	c.mu.Lock()
	n, ok := c.cache[s]
	c.mu.Unlock()
	if ok {
		return n, nil
	}
	n, err := c.enc.Count(ctx, s)
	if err != nil {
		return 0, err
	}
	if len(s) > maxCachedLineBytes {
		return n, nil // a line this long rarely comes again: counting it is cheaper than pinning it
	}
	c.mu.Lock()
	if len(c.cache) >= maxCachedLines || c.cachedBytes+len(s) > maxCachedBytes {
		clear(c.cache)
		c.cachedBytes = 0
	}
	// A copy: s is a slice of the whole prompt, which the key would otherwise keep alive.
	c.cache[strings.Clone(s)] = n
	c.cachedBytes += len(s)
	c.mu.Unlock()
	return n, nil
}

// approxCounter is the documented deterministic approximation: every CJK character (Han,
// Hiragana, Katakana, Hangul) is one token, and every other run of text costs one token per four
// bytes, rounded up.
type approxCounter struct{}

func (approxCounter) Name() string { return approxName }

func (approxCounter) Count(_ context.Context, s string) (int, error) {
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
	return tokens + (run+3)/4, nil
}
