package wasm_test

import (
	"context"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
)

// BenchmarkRunExampleBuilder: one build by each shipped example builder, as composers run it: the
// Go one as a reactor (its runtime started once, each call set back to the snapshot) and as a
// command (its runtime starts in every fresh instance), and the C and Rust ones (commands).
//
// `go test -run '^$' -bench RunExampleBuilder -benchmem ./internal/wasm`
func BenchmarkRunExampleBuilder(b *testing.B) {
	for _, example := range []struct {
		name  string
		build func(testing.TB, string) []byte
		dir   string
	}{
		{"go-reactor", testenv.BuildWasmReactor, "../../builders/phi4mini"},
		{"go-command", testenv.BuildWasm, "../../builders/phi4mini"},
		{"c", testenv.BuildC, "../../builders/phi4mini-c"},
		{"rust", testenv.BuildRust, "../../builders/phi4mini-rs"},
	} {
		b.Run(example.name, func(b *testing.B) {
			e, err := wasmEngine(b)
			if err != nil {
				b.Fatal(err)
			}
			m, err := e.Load(context.Background(), example.build(b, example.dir))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := m.Run(context.Background(), []byte(buildInput), requestTime); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
