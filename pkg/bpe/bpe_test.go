package bpe

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pkoukk/tiktoken-go"
	loader "github.com/pkoukk/tiktoken-go-loader"
)

// reference is tiktoken-go, the counter this package must agree with token for token.
var reference = sync.OnceValue(func() map[string]*tiktoken.Tiktoken {
	tiktoken.SetBpeLoader(loader.NewOfflineLoader())
	out := map[string]*tiktoken.Tiktoken{}
	for _, name := range Names() {
		enc, err := tiktoken.GetEncoding(name)
		if err != nil {
			panic(err)
		}
		out[name] = enc
	}
	return out
})

var encodings = sync.OnceValue(func() map[string]*Encoding {
	out := map[string]*Encoding{}
	for _, name := range Names() {
		e, err := Load(name)
		if err != nil {
			panic(err)
		}
		out[name] = e
	}
	return out
})

// alphabet holds runs of every class the two patterns tell apart.
var alphabet = []string{
	"the", "The", "THE", "hello", "World", "naïve", "Straße", "ﬁne", "x", "a", "I",
	"'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'D", "'", "’s", "don't", "WE'LL",
	"0", "7", "42", "123", "2026", "1234567", "3.14", "1,000", "٣٤", "½", "Ⅻ",
	" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00a0", "\u3000", "\u2028",
	".", ",", "!", "?", "...", "—", "-", "--", "(", ")", "{", "}", "[", "]", "<", ">", "&", "\"", "/", "//", "\\", "#", "@", "$", "%", "^", "*", "_", "=", "+", "|", "~", "`", ";", ":",
	"日本語", "漢字", "ひらがな", "カタカナ", "한국어", "中文测试", "。", "、",
	"Привет", "мир", "Ελληνικά", "עברית", "العربية", "हिन्दी", "ไทย",
	"é", "e\u0301", "\u0301", "ñ", "Å", "ǅ", "ǈ", "ʰ", "ᵃ",
	"😀", "👍🏽", "🇯🇵", "👨‍👩‍👧", "❤️", "\u200d", "\ufeff",
	"func main() {", "if x != nil {", "return err", "<a href=\"x\">", "{{x}}", "a_b", "snake_case", "camelCase", "HTTPServer",
	"<|endoftext|>", "<|im_start|>",
	"'ſ", "'Ｓ", "\u0085", "\v", "\f", "\u2029", "\u200b", "\u0301\u0301", "ٖ", "\u20dd", "Ⅻ", "²", "\r", "\r\r\n", "/", "\n/", "!\n/",
}

// corpus builds n seeded texts of up to maxPieces runs from alphabet, some with long runs.
func corpus(seed uint64, n, maxPieces int) []string {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		for range 1 + rng.IntN(maxPieces) {
			s := alphabet[rng.IntN(len(alphabet))]
			if rng.IntN(40) == 0 {
				s = strings.Repeat(s, 1+rng.IntN(400)) // long runs: letters, digits, spaces, CJK, emoji
			}
			b.WriteString(s)
		}
		out[i] = b.String()
	}
	return out
}

// TestCountEqualsTiktoken compares counts with tiktoken-go on 3,000 seeded texts and fixed edge
// cases, for both encodings.
func TestCountEqualsTiktoken(t *testing.T) {
	texts := append(corpus(1, 3000, 40),
		"", " ", "\n", "a", strings.Repeat("a", 3000), strings.Repeat(" ", 300)+"x", "x"+strings.Repeat(" ", 300),
		strings.Repeat("\n", 50), strings.Repeat("1", 100), strings.Repeat("日", 500), strings.Repeat("😀", 100),
		"invalid \xff\xfe utf-8 \xc3", "trailing space ", " leading", "a\r\nb", "line\n\n\nline", "tab\t\tstop",
	)
	for _, name := range Names() {
		ref, enc := reference()[name], encodings()[name]
		for _, s := range texts {
			want := len(ref.EncodeOrdinary(s))
			got, err := enc.Count(context.Background(), s)
			if err != nil || got != want {
				t.Fatalf("%s: Count(%.80q…) = %d, %v; tiktoken-go says %d", name, s, got, err, want)
			}
		}
	}
}

// FuzzCount checks any text against tiktoken-go.
func FuzzCount(f *testing.F) {
	for _, s := range corpus(2, 20, 10) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			return // tiktoken-go is quadratic on long pieces
		}
		for _, name := range Names() {
			want := len(reference()[name].EncodeOrdinary(s))
			got, err := encodings()[name].Count(context.Background(), s)
			if err != nil || got != want {
				t.Fatalf("%s: Count(%q) = %d, %v; tiktoken-go says %d", name, s, got, err, want)
			}
		}
	})
}

// lookingContext counts the looks Count takes at it (its Err calls) and ends at look endAt (0:
// never), as if its deadline had passed just then. Count only ever calls Err, so the test knows
// exactly where in the work the context ended, whatever the machine's load.
type lookingContext struct {
	context.Context
	endAt, looks int
}

func (c *lookingContext) Err() error {
	if c.looks++; c.endAt == 0 || c.looks < c.endAt {
		return nil
	}
	return context.DeadlineExceeded
}

// TestCountStopsWithContext: counting a megabyte stops at the first look at its context after the
// context ends, it looks once every checkEvery units of work (pieces, a long piece's setup steps,
// merges), the setup of a long piece included, so a cancelled count stops within checkEvery units;
// and it does not count at all once the context has ended. The work is asserted, not the time: a
// bound of 500ms on the time after a 20ms deadline failed on a loaded machine (1.17s), because the
// setup of a megabyte piece (its pair ranks and heap, 30-260 ms) did not look at the context.
func TestCountStopsWithContext(t *testing.T) {
	enc := encodings()["o200k_base"]
	for _, tt := range []struct {
		name string
		text string
		work func(tokens int) int // at least the units checkEvery counts
	}{
		// One piece: the setup visits its 1,048,576 bytes, then they merge into the tokens, one
		// merge fewer parts each time.
		{"one letter", strings.Repeat("a", 1<<20), func(tokens int) int { return 1<<20 + 1<<20 - tokens }},
		// 524,288 pieces " a", each one token.
		{"one short word", strings.Repeat(" a", 1<<19), func(tokens int) int { return tokens }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			all := &lookingContext{Context: context.Background()}
			n, err := enc.Count(all, tt.text)
			if err != nil {
				t.Fatal(err)
			}
			if work := tt.work(n); work < 100*checkEvery || all.looks < work/checkEvery {
				t.Fatalf("Count looked at its context %d times for %d merges or pieces, want at least one look every %d", all.looks, work, checkEvery)
			}
			for _, endAt := range []int{1, 2, 7} {
				c := &lookingContext{Context: context.Background(), endAt: endAt}
				if n, err := enc.Count(c, tt.text); !errors.Is(err, context.DeadlineExceeded) || n != 0 {
					t.Fatalf("context ended at look %d: Count = %d, %v; want context.DeadlineExceeded", endAt, n, err)
				}
				// Reading the error once more is fine; another look means it counted on.
				if after := c.looks - endAt; after > 1 {
					t.Errorf("context ended at look %d: Count looked %d more times (%d merges or pieces each) before it returned", endAt, after, checkEvery)
				}
			}
		})
	}
	// A real deadline: counting a megabyte of one letter takes far longer than 20ms.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := enc.Count(ctx, strings.Repeat("a", 1<<20)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Count past its deadline: %v, want context.DeadlineExceeded", err)
	}
	t.Logf("Count returned %s after a 20ms deadline", time.Since(start).Round(time.Millisecond)) // logged only: load sets it
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	if n, err := enc.Count(done, "short text"); !errors.Is(err, context.Canceled) || n != 0 {
		t.Errorf("Count with an ended context = %d, %v; want context.Canceled", n, err)
	}
}

// TestScannersMatchThePatterns compares the hand-written pre-tokenizers with the published
// patterns run by regexp2, piece for piece, on the seeded corpus and edge cases.
func TestScannersMatchThePatterns(t *testing.T) {
	texts := append(corpus(3, 3000, 40), "", " ", "  x", " \n", "a \n b", "x  ", "\t\n\t", "'s", "'S'll", "''", "' s", "\u0301a", "a\u0301", "!\u0301x", "ǅx", "Ǆǅǆ")
	for _, name := range Names() {
		ref, got := regexpSplitter(patterns[name]), splitters[name]()
		for _, s := range texts {
			var want, have []string
			ref(s, func(p string) bool { want = append(want, p); return true })
			got(s, func(p string) bool { have = append(have, p); return true })
			if strings.Join(want, "\x00") != strings.Join(have, "\x00") {
				t.Fatalf("%s: %q\n pattern: %q\n scanner: %q", name, s, want, have)
			}
		}
	}
}

// FuzzPretokenize checks the hand-written pre-tokenizers against the published patterns piece
// for piece on any text.
func FuzzPretokenize(f *testing.F) {
	for _, s := range corpus(4, 20, 10) {
		f.Add(s)
	}
	refs := map[string]splitter{}
	for _, name := range Names() {
		refs[name] = regexpSplitter(patterns[name])
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range Names() {
			var want, have []string
			refs[name](s, func(p string) bool { want = append(want, p); return true })
			splitters[name]()(s, func(p string) bool { have = append(have, p); return true })
			if strings.Join(want, "\x00") != strings.Join(have, "\x00") {
				t.Fatalf("%s: %q\n pattern: %q\n scanner: %q", name, s, want, have)
			}
		}
	})
}
