package wasm_test

import (
	"context"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
)

// BenchmarkRunExampleBuilder: one build by the shipped example builder (a Go module): a fresh
// instance per call, as composers run it.
func BenchmarkRunExampleBuilder(b *testing.B) {
	e, err := wasmEngine(b)
	if err != nil {
		b.Fatal(err)
	}
	m, err := e.Load(context.Background(), testenv.BuildWasm(b, "../../builders/phi4mini"))
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
}
