package compose

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
)

// renderInputs is round 11 of a 20-team tournament for a team with 10 rounds of history.
func renderInputs() Inputs {
	var hist []events.TeamRound
	for r := 1; r <= 10; r++ {
		hist = append(hist, tr(r, 60+float64(r)*2.5, fmt.Sprintf("round %d: ", r)+strings.Repeat("a measured answer with code `x := y` and prose. ", 20),
			"tighten the argument and cite the spec",
			events.Metric{MetricName: "Clarity", Score: 70, EvaluatorComment: "good"}, events.Metric{MetricName: "Depth", Score: 65.5, EvaluatorComment: "thin in places"}))
	}
	var board []events.LeaderboardRow
	for i := 1; i <= 20; i++ {
		team, name := fmt.Sprintf("team-%02d", i), fmt.Sprintf("Team %02d", i)
		if i == 7 {
			team, name = "team-alpha", "Alpha"
		}
		board = append(board, lb(i, i, team, name, 100-float64(i)*1.5, 4, 10))
	}
	req := request(11, "team-round")
	req.MaxRounds = 12
	hr, lt := 10, 20
	req.Limits.HistoryRounds, req.Limits.LeaderboardTeams = &hr, &lt
	return Inputs{RequestID: "req-bench", Request: req, Time: roundTime, History: hist, Leaderboard: board, EvaluationsSeq: 200}
}

// BenchmarkRender composes team-round for 10 rounds of history and 20 teams: context, render,
// token count. Templates were parsed at Load; nothing is parsed here. The prompt fits its
// budget, so this is one render and one count; BenchmarkRenderOverBudget shows the cut search.
func BenchmarkRender(b *testing.B) {
	for _, enc := range []string{"o200k_base", "approx-cjk-v1"} {
		b.Run(enc, func(b *testing.B) {
			benchCompose(b, enc, renderInputs(), false)
		})
	}
	// Every line encoded afresh: the cost of a prompt that shares no line with earlier ones.
	b.Run("o200k_base-cold", func(b *testing.B) {
		benchCompose(b, "o200k_base", renderInputs(), true)
	})
}

// BenchmarkRenderOverBudget is the same request with a budget that forces cuts.
func BenchmarkRenderOverBudget(b *testing.B) {
	in := renderInputs()
	max := 900
	in.Request.Limits.MaxPromptTokens = &max
	benchCompose(b, "o200k_base", in, false)
}

func benchCompose(b *testing.B, encoding string, in Inputs, cold bool) {
	tokens, err := NewTokenCounter(encoding)
	if err != nil {
		b.Fatal(err)
	}
	l, err := Load(Options{Tokens: tokens})
	if err != nil {
		b.Fatal(err)
	}
	out, err := l.Compose(context.Background(), in)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if bpe, ok := tokens.(*bpeCounter); ok && cold {
			bpe.mu.Lock()
			clear(bpe.cache)
			bpe.mu.Unlock()
		}
		if _, err := l.Compose(context.Background(), in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(out.Prompt)), "prompt-bytes")
	b.ReportMetric(float64(out.TokenEstimate), "tokens")
	b.ReportMetric(float64(len(out.Truncated)), "cuts")
}
