package console

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/")

// TestChartGolden renders the score chart of a small tournament (a tie, a team that got worse,
// a team with one round, a hostile team name) and compares it with testdata/chart.golden.svg.
func TestChartGolden(t *testing.T) {
	scores := []rank.RoundScore{
		{TeamID: "alpha", Round: 1, Score: 60}, {TeamID: "alpha", Round: 2, Score: 77.5}, {TeamID: "alpha", Round: 3, Score: 70},
		{TeamID: "beta", Round: 1, Score: 65}, {TeamID: "beta", Round: 2, Score: 77.5}, {TeamID: "beta", Round: 3, Score: 85},
		{TeamID: "gamma", Round: 2, Score: 50},
	}
	board := []events.LeaderboardRow{
		{TeamID: "beta", TeamName: "Beta", Rank: 1}, {TeamID: "alpha", TeamName: `"><script>alert(1)</script>`, Rank: 2},
		{TeamID: "gamma", TeamName: "Gamma", Rank: 3},
	}
	for _, tt := range []struct {
		name  string
		order events.ScoreOrder
	}{{"chart.golden.svg", events.Desc}, {"chart-asc.golden.svg", events.Asc}} {
		t.Run(tt.name, func(t *testing.T) {
			pages, err := parsePages()
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := pages["execution"].ExecuteTemplate(&got, "chart", scoreChart(scores, board, tt.order)); err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(got.Bytes(), []byte("<script>")) {
				t.Fatal("a team name was written as markup")
			}
			path := filepath.Join("testdata", tt.name)
			if *update {
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("the chart differs from %s (run with -update after checking it):\n%s", path, got.String())
			}
		})
	}
}

func TestChartEmptyAndSingleRound(t *testing.T) {
	if c := scoreChart(nil, nil, events.Desc); !c.Empty {
		t.Error("no scores, yet a chart")
	}
	c := scoreChart([]rank.RoundScore{{TeamID: "a", Round: 1, Score: 5}}, []events.LeaderboardRow{{TeamID: "a"}}, events.Desc)
	if len(c.Lines) != 1 || c.Lines[0].Scores == "" || len(c.XTicks) != 1 {
		t.Errorf("one round of one team: %+v", c)
	}
}
