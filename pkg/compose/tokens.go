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
	return bpeCounter{enc: enc, name: name}, nil
}

// bpeCounter counts with a BPE tokenizer. Special-token text in a prompt ("<|endoftext|>" in a
// submission) is counted as the ordinary text it is, never as a control token.
type bpeCounter struct {
	enc  *tiktoken.Tiktoken
	name string
}

func (c bpeCounter) Name() string       { return c.name }
func (c bpeCounter) Count(s string) int { return len(c.enc.EncodeOrdinary(s)) }

// approxCounter is the documented deterministic approximation: every CJK character (Han,
// Hiragana, Katakana, Hangul) is one token, and every other run of text costs one token per four
// bytes, rounded up.
type approxCounter struct{}

func (approxCounter) Name() string { return approxName }

func (approxCounter) Count(s string) int {
	tokens, run := 0, 0
	for _, r := range s {
		if unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul) {
			tokens += (run+3)/4 + 1
			run = 0
			continue
		}
		run += utf8.RuneLen(r)
	}
	return tokens + (run+3)/4
}
