package bpe

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// coldTexts are distinct texts of about 2 KB, as submissions and feedback of a real tournament
// are: no two share a line, so no cache of any kind could help.
func coldTexts(n int) []string {
	texts := corpus(7, n, 400)
	for i := range texts {
		texts[i] = fmt.Sprintf("Submission %d. ", i) + texts[i]
	}
	return texts
}

// BenchmarkCountCold counts distinct texts with this package and with tiktoken-go in the same
// run: the ratio is the speed-up on data a tournament makes.
func BenchmarkCountCold(b *testing.B) {
	texts := coldTexts(512)
	for _, name := range Names() {
		enc, ref := encodings()[name], reference()[name]
		b.Run(name+"/bpe", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := enc.Count(context.Background(), texts[i%len(texts)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		noCache := *enc
		noCache.pieces = nil
		b.Run(name+"/bpe-without-piece-cache", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := noCache.Count(context.Background(), texts[i%len(texts)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/tiktoken-go", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				_ = ref.EncodeOrdinary(texts[i%len(texts)])
			}
		})
	}
}

// BenchmarkCountLongRun counts one letter repeated 100 KiB and 1 MiB: growth is linear when the
// second takes about ten times the first (the merge is O(n log n)).
func BenchmarkCountLongRun(b *testing.B) {
	enc := encodings()["o200k_base"]
	for _, size := range []int{100 << 10, 1 << 20} {
		s := strings.Repeat("a", size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			for b.Loop() {
				if _, err := enc.Count(context.Background(), s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
