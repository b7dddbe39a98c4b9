package console

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// tournament is a store and streams holding a played tournament, as a ranker and a composer
// would have left them, on real servers.
type tournament struct {
	exec  string
	st    *chstore.Store
	cfg   chstore.Config
	nc    *nats.Conn
	js    jetstream.JetStream
	teams int
	round int
}

// seed plays teams x rounds: every round requested (ROUNDS), answered (PROMPTS, a distinct
// prompt of about promptBytes) and evaluated (ClickHouse, a distinct submission). The texts
// are distinct, as a tournament's are, so nothing is served from a repetition.
func seed(tb testing.TB, teams, rounds, promptBytes int) *tournament {
	tb.Helper()
	nc, js := testenv.JetStream(tb, testenv.NATS(tb))
	return seedOn(tb, nc, js, teams, rounds, promptBytes)
}

// seedOn is seed on a JetStream server of the caller's.
func seedOn(tb testing.TB, nc *nats.Conn, js jetstream.JetStream, teams, rounds, promptBytes int) *tournament {
	tb.Helper()
	ctx := context.Background()
	st, cfg := testenv.Store(tb, true)
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamRounds, events.StreamPrompts, events.StreamDeadLetter); err != nil {
		tb.Fatal(err)
	}
	tr := &tournament{exec: "exec-seeded", st: st, cfg: cfg, nc: nc, js: js, teams: teams, round: rounds}
	at := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var recs []rank.Record
	seq := uint64(0)
	for r := 1; r <= rounds; r++ {
		for t := range teams {
			team := fmt.Sprintf("team-%03d", t)
			id := fmt.Sprintf("req-%s-%d", team, r)
			req := events.RoundRequested{ExecutionID: tr.exec, TeamID: team, TeamName: "Team " + team, RoundNumber: r, UserPrompt: "the task"}
			publish(tb, js, events.RoundSubject(tr.exec, team), id, events.TypeRoundRequested, at, req)
			pos := t + 1
			pc := events.PromptComposed{RequestID: id, ExecutionID: tr.exec, TeamID: team, TeamName: "Team " + team, RoundNumber: r,
				Prompt: distinct(fmt.Sprintf("prompt of %s round %d", team, r), promptBytes), PromptSHA256: "00",
				Template: events.TemplateRef{Name: "team-round", Version: 4, SHA256: "00"}, TokenEstimate: promptBytes / 4, TokenEncoding: "o200k_base",
				Truncated: []events.Truncation{}, Inputs: events.ComposeInputs{EvaluationIDs: []string{}, HistoryRounds: []int{},
					Leaderboard: []events.LeaderboardRow{}, TeamPosition: &pos, TeamCount: teams, EvaluationsSeq: seq}}
			if r%7 == 0 {
				pc.Truncated = append(pc.Truncated, events.Truncation{Section: "history", Detail: "rounds 1-2 omitted"})
			}
			publish(tb, js, events.PromptComposedSubject(tr.exec, team), "answer-"+id, events.TypePromptComposed, at, pc)
			seq++
			recs = append(recs, rank.Record{EventID: fmt.Sprintf("eval-%s-%d", team, r), Source: "test", Seq: seq,
				EvaluationCompleted: events.EvaluationCompleted{ExecutionID: tr.exec, TeamID: team, TeamName: "Team " + team, RoundNumber: r,
					Submission: events.Submission{Content: distinct(fmt.Sprintf("submission of %s round %d", team, r), 2000), Format: "md"},
					Evaluation: events.Scores{OverallScore: float64((t*37+r*11)%100) + 0.5, Feedback: "feedback " + team,
						Metrics: []events.Metric{{MetricName: "Clarity", Score: 50, EvaluatorComment: "fine"}}},
					EvaluatedAt: at.Add(time.Duration(seq) * time.Second)}})
		}
	}
	for i := 0; i < len(recs); i += 500 {
		if err := st.Insert(ctx, recs[i:min(i+500, len(recs))]); err != nil {
			tb.Fatal(err)
		}
	}
	// As a ranker notes it: the store whole, anchored on the last row it stored.
	if err := st.NoteLineage(ctx, chstore.Lineage{Epoch: 1, Stream: "seeded", Anchor: chstore.KeyOf(recs[len(recs)-1]), Whole: true}); err != nil {
		tb.Fatal(err)
	}
	return tr
}

// distinct is n bytes of text that begins with head and repeats nothing of another call's.
func distinct(head string, n int) string {
	var b strings.Builder
	b.WriteString(head)
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "\n%s line %d: %x", head, i, i*2654435761)
	}
	return b.String()[:n]
}

func publish(tb testing.TB, js jetstream.JetStream, subject, id, eventType string, at time.Time, data any) {
	tb.Helper()
	body, err := events.Marshal(id, "test", eventType, at, data)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := events.Publish(context.Background(), js, subject, id, body); err != nil {
		tb.Fatal(err)
	}
}

// console builds a console over the tournament's servers, closed when the test ends.
func (tr *tournament) console(tb testing.TB) *Console {
	tb.Helper()
	c, err := New(Deps{Log: slog.New(slog.DiscardHandler), Reg: prometheus.NewRegistry(), NC: tr.nc, JS: tr.js, Store: tr.st,
		MaxViewers: 1000, CacheExecutions: 4})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// get answers one request through the console's handler.
func get(tb testing.TB, h http.Handler, path string) (int, string) {
	tb.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b)
}
