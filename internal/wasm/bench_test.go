package wasm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
)

// BenchmarkRunExampleBuilder: one build by each shipped example builder, as composers run it: the
// Go one as a reactor (its runtime started once, each call set back to the snapshot) and as a
// command (its runtime starts in every fresh instance), and the C and Rust ones (reactors), on the
// small test input and on a tournament's context (10 teams, 4 rounds of 1,500 characters of
// distinct feedback and previews: about 14 KB of JSON, as BenchmarkBuilderVersusTemplate's).
//
// `go test -run '^$' -bench RunExampleBuilder -benchmem ./internal/wasm`
func BenchmarkRunExampleBuilder(b *testing.B) {
	inputs := []struct {
		name  string
		input []byte
	}{{"small", []byte(buildInput)}, {"tournament", tournamentInput()}}
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
		e, err := wasmEngine(b)
		if err != nil {
			b.Fatal(err)
		}
		m, err := e.Load(context.Background(), example.build(b, example.dir))
		if err != nil {
			b.Fatal(err)
		}
		for _, in := range inputs {
			b.Run(example.name+"/"+in.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(in.input)))
				for b.Loop() {
					if _, err := m.Run(context.Background(), in.input, requestTime); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// tournamentInput is a build request whose context is a tournament's: 4 rounds of history with
// 1,500 characters of feedback and of preview each, no two alike, and a leaderboard of 10 teams.
func tournamentInput() []byte {
	text := func(seed, n int) string {
		var s strings.Builder
		for i := 0; s.Len() < n; i++ {
			fmt.Fprintf(&s, "word%d-%d ", seed, i*7919%1000)
		}
		return s.String()[:n]
	}
	var history []map[string]any
	for r := 1; r <= 4; r++ {
		history = append(history, map[string]any{"round_number": r, "score": 0.1 * float64(r), "score_text": fmt.Sprintf("%.2f", 0.1*float64(r)),
			"feedback": text(r, 1500), "preview": text(100+r, 1500)})
	}
	var board []map[string]any
	for t := 1; t <= 10; t++ {
		board = append(board, map[string]any{"position": t, "rank": t, "team_name": fmt.Sprintf("Team %02d", t), "best_score": 1 - 0.05*float64(t),
			"best_score_text": fmt.Sprintf("%.2f", 1-0.05*float64(t)), "best_round": 1 + t%4, "is_self": t == 3})
	}
	in, err := json.Marshal(map[string]any{"op": "build", "model": "phi-4-mini", "vars": map[string]any{},
		"context": map[string]any{"team": map[string]any{"id": "t03", "name": "Team 03"}, "user_prompt": "Write the best possible design document for a rate limiter.",
			"round_number": 5, "is_first_round": false, "current_datetime": "2026-03-01T09:30:00", "history": history, "leaderboard": board}})
	if err != nil {
		panic(err)
	}
	return in
}
