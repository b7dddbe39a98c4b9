package console

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// The score chart is a small SVG written here rather than by a chart library: it is lines on a
// grid, its geometry is a golden test, and it needs no script, so the page's CSP stays
// script-src 'self' with nothing but the console's own file. Colours and labels are attributes
// (the CSP forbids inline style).

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 720, 300
	padL, padR     = 48, 12
	padT, padB     = 12, 28
)

// palette cycles over teams: ten hues that stay apart on white.
var palette = [...]string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

type chartLine struct {
	TeamID, TeamName string
	Colour           string
	Scores           string // polyline points of the score of each round
	Best             string // polyline points of the best score so far
	Marker           int    // the dot marker of its colour (one marker per colour, not an element per point)
	Summary          string // every round's score, what a hover says
}

type chartTick struct {
	Pos   string
	Label string
}

type chart struct {
	Aria                           string // what the chart shows, for screen readers
	W, H, Left, Right, Top, Bottom int
	Lines                          []chartLine
	XTicks, YTicks                 []chartTick
	Colours                        []string // of the markers, by index
	Empty                          bool
}

// scoreChart draws every team's score per round and its best so far (under order), teams in
// leaderboard order so colours follow positions.
func scoreChart(rounds []rank.RoundScore, board []events.LeaderboardRow, order events.ScoreOrder) chart {
	c := chart{Aria: "score of each team per round; dashed: its best so far", W: chartW, H: chartH, Left: padL, Right: chartW - padR, Top: padT, Bottom: chartH - padB}
	if len(rounds) == 0 {
		c.Empty = true
		return c
	}
	lo, hi, maxRound := math.Inf(1), math.Inf(-1), 1
	byTeam := map[string][]rank.RoundScore{}
	for _, r := range rounds {
		lo, hi, maxRound = math.Min(lo, r.Score), math.Max(hi, r.Score), max(maxRound, r.Round)
		byTeam[r.TeamID] = append(byTeam[r.TeamID], r) // by round already: Reduction orders them
	}
	if hi == lo {
		lo, hi = lo-1, hi+1
	}
	x := func(round int) float64 {
		if maxRound == 1 {
			return float64(c.Left+c.Right) / 2
		}
		return float64(c.Left) + float64(round-1)*float64(c.Right-c.Left)/float64(maxRound-1)
	}
	y := func(score float64) float64 {
		return float64(c.Bottom) - (score-lo)*float64(c.Bottom-c.Top)/(hi-lo)
	}
	for i, row := range board {
		rs := byTeam[row.TeamID]
		line := chartLine{TeamID: row.TeamID, TeamName: row.TeamName, Colour: palette[i%len(palette)], Marker: i % len(palette)}
		var pts, best, summary strings.Builder
		var top float64
		for j, r := range rs {
			if j == 0 || better(r.Score, top, order) {
				top = r.Score
			}
			fmt.Fprintf(&pts, "%s,%s ", num(x(r.Round)), num(y(r.Score)))
			fmt.Fprintf(&best, "%s,%s ", num(x(r.Round)), num(y(top)))
			if j > 0 {
				summary.WriteString(", ")
			}
			fmt.Fprintf(&summary, "round %d %s", r.Round, strconv.FormatFloat(r.Score, 'f', -1, 64))
		}
		line.Scores, line.Best, line.Summary = strings.TrimSpace(pts.String()), strings.TrimSpace(best.String()), summary.String()
		c.Lines = append(c.Lines, line)
	}
	c.Colours = palette[:min(len(board), len(palette))]
	// About ten ticks whatever the last round (a valid round number may be 2147483647: the
	// ticks are stepped to, not searched for).
	step := 1
	if maxRound > 20 {
		step = maxRound/10 + 1
	}
	for r := 1; r <= maxRound; r += step {
		c.XTicks = append(c.XTicks, chartTick{Pos: num(x(r)), Label: strconv.Itoa(r)})
		if r > maxRound-step {
			break // r+step would overflow near the largest int32 round on 32-bit ints
		}
	}
	if last := c.XTicks[len(c.XTicks)-1]; last.Label != strconv.Itoa(maxRound) {
		c.XTicks = append(c.XTicks, chartTick{Pos: num(x(maxRound)), Label: strconv.Itoa(maxRound)})
	}
	for i := 0; i <= 4; i++ {
		v := lo + float64(i)*(hi-lo)/4
		c.YTicks = append(c.YTicks, chartTick{Pos: num(y(v)), Label: strconv.FormatFloat(v, 'g', 4, 64)})
	}
	return c
}

func better(a, b float64, order events.ScoreOrder) bool {
	if order == events.Asc {
		return a < b
	}
	return a > b
}

// num prints a coordinate with one decimal: enough for a 720-unit chart, and stable bytes.
func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
