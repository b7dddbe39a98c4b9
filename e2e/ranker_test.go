package e2e

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// published is one evaluation.completed as the test sent it.
type published struct {
	id string
	ev events.EvaluationCompleted
}

// tournament generates a seeded, shuffled stream of evaluations with exact ties, re-evaluations
// (later evaluated_at, or the same microsecond with another id), replays of an id with a
// different body (which must change nothing) and offsets other than UTC.
func tournament(seed uint64, executions, teams, rounds int) (sends []published, firstByID map[string]published) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	scores := []float64{50, 60, 70, 70, 70.25, 80.5, 99.99, -3, 1e-05}
	zones := []*time.Location{time.UTC, time.FixedZone("JST", 9*3600), time.FixedZone("NST", -(3*3600 + 1800))}
	base := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	n := 0
	for e := range executions {
		exec := fmt.Sprintf("exec-%d", e)
		for tm := range teams {
			team := fmt.Sprintf("team-%02d", rng.IntN(teams*3)) // sparse, unordered team ids
			if tm == 0 {
				team = "team-00"
			}
			for r := 1; r <= 1+rng.IntN(rounds); r++ {
				evals := 1 + rng.IntN(3) // 1 to 3 evaluations of the round
				for range evals {
					n++
					at := base.Add(time.Duration(rng.IntN(5)) * time.Minute).Add(time.Duration(rng.IntN(3)) * 1500 * time.Nanosecond)
					ev := evaluation(exec, team, fmt.Sprintf("Team %s v%d", team, n), r, scores[rng.IntN(len(scores))], fmt.Sprintf("sub %d", n), at.In(zones[rng.IntN(len(zones))]))
					// Unique ids whose order is unrelated to publication order.
					sends = append(sends, published{id: fmt.Sprintf("ev-%06d-%d", rng.IntN(1_000_000), n), ev: ev})
				}
			}
		}
	}
	// Replays: the same id again, sometimes with another body.
	for i := range len(sends) / 5 {
		orig := sends[i*3%len(sends)]
		replay := orig
		switch i % 3 {
		case 0:
			replay.ev.Evaluation.OverallScore = 1000
			replay.ev.EvaluatedAt = replay.ev.EvaluatedAt.Add(time.Hour)
		case 1:
			replay.ev.RoundNumber += 7 // a corrupted replay naming another round changes nothing either
		}
		sends = append(sends, replay)
	}
	rng.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })
	// Ids are unique per event, and a replay travels on the subject of its event, so the first
	// copy of an id is the event.
	firstByID = map[string]published{}
	for _, s := range sends {
		if _, ok := firstByID[s.id]; !ok {
			firstByID[s.id] = s
		}
	}
	return sends, firstByID
}

// truth computes the leaderboards and histories of docs/contract.md#ranking directly, without pkg/rank.
func truth(firstByID map[string]published, asc bool) (boards map[string][]events.LeaderboardRow, latest map[string]map[string][]published) {
	type key struct{ exec, team string }
	type rkey struct {
		key
		round int
	}
	win := map[rkey]published{}
	for _, p := range firstByID {
		k := rkey{key{p.ev.ExecutionID, p.ev.TeamID}, p.ev.RoundNumber}
		cur, ok := win[k]
		at, curAt := p.ev.EvaluatedAt.UnixMicro(), cur.ev.EvaluatedAt.UnixMicro()
		if !ok || at > curAt || at == curAt && p.id > cur.id {
			win[k] = p
		}
	}
	latest = map[string]map[string][]published{}
	for k, p := range win {
		if latest[k.exec] == nil {
			latest[k.exec] = map[string][]published{}
		}
		latest[k.exec][k.team] = append(latest[k.exec][k.team], p)
	}
	boards = map[string][]events.LeaderboardRow{}
	for exec, teams := range latest {
		var rows []events.LeaderboardRow
		for team, rs := range teams {
			slices.SortFunc(rs, func(a, b published) int { return a.ev.RoundNumber - b.ev.RoundNumber })
			teams[team] = rs
			row := events.LeaderboardRow{TeamID: team, Rounds: len(rs), BestScore: rs[0].ev.Evaluation.OverallScore, BestRound: rs[0].ev.RoundNumber}
			newest := rs[0]
			for _, p := range rs {
				s := p.ev.Evaluation.OverallScore
				if asc && s < row.BestScore || !asc && s > row.BestScore {
					row.BestScore, row.BestRound = s, p.ev.RoundNumber
				}
				at, nAt := p.ev.EvaluatedAt.UnixMicro(), newest.ev.EvaluatedAt.UnixMicro()
				if at > nAt || at == nAt && p.id > newest.id {
					newest = p
				}
			}
			row.TeamName = newest.ev.TeamName
			rows = append(rows, row)
		}
		slices.SortFunc(rows, func(a, b events.LeaderboardRow) int {
			if a.BestScore != b.BestScore {
				if asc == (a.BestScore < b.BestScore) {
					return -1
				}
				return 1
			}
			return cmp.Compare(a.TeamID, b.TeamID)
		})
		for i := range rows {
			rows[i].Position, rows[i].Rank = i+1, i+1
			for j := i - 1; j >= 0 && rows[j].BestScore == rows[i].BestScore; j-- {
				rows[i].Rank = rows[j].Position
			}
		}
		boards[exec] = rows
	}
	return boards, latest
}

type history struct {
	ExecutionID string             `json:"execution_id"`
	TeamID      string             `json:"team_id"`
	Rounds      []events.TeamRound `json:"rounds"`
}

// TestRankerMatchesGroundTruth feeds a seeded randomized tournament through one ranker and
// through two replicas sharing the durable, and compares every leaderboard (both orders) and
// every history with the ground truth, field by field.
func TestRankerMatchesGroundTruth(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			e := newEnv(t)
			var rankers []*proc
			for range replicas {
				rankers = append(rankers, e.start("ranker", "RANKER_BATCH_SIZE=64", "RANKER_FLUSH_INTERVAL=20ms"))
			}
			sends, first := tournament(uint64(42+replicas), 10, 8, 6)
			publishAll(t, e, sends, 0, len(sends))
			waitCommitted(t, e, len(sends))
			ties := 0
			boards, _ := truth(first, false)
			for _, rows := range boards {
				for _, r := range rows {
					if r.Rank != r.Position {
						ties++
					}
				}
			}
			if ties == 0 || len(sends)-len(first) < 50 {
				t.Fatalf("generator lost its edge cases: %d tied rows, %d replays", ties, len(sends)-len(first))
			}
			t.Logf("%d events (%d replays), %d executions, %d rows sharing a rank", len(sends), len(sends)-len(first), len(boards), ties)
			for _, asc := range []bool{false, true} {
				boards, latest := truth(first, asc)
				query := ""
				if asc {
					query = "?score_order=asc"
				}
				for exec, want := range boards {
					var got leaderboard
					rankers[len(rankers)-1].getJSON(t, "/v1/executions/"+exec+"/leaderboard"+query, &got)
					if diff := gocmp.Diff(want, got.Teams); diff != "" {
						t.Errorf("%s%s leaderboard (-truth +api):\n%s", exec, query, diff)
					}
					if asc {
						continue
					}
					for team, rs := range latest[exec] {
						var h history
						rankers[0].getJSON(t, "/v1/executions/"+exec+"/teams/"+team+"/history", &h)
						var wantIDs, gotIDs []string
						for _, p := range rs {
							wantIDs = append(wantIDs, p.id)
						}
						for _, r := range h.Rounds {
							gotIDs = append(gotIDs, r.EvaluationID)
						}
						if diff := gocmp.Diff(wantIDs, gotIDs); diff != "" {
							t.Errorf("%s/%s history ids (-truth +api):\n%s", exec, team, diff)
						}
						for i, r := range h.Rounds {
							if i < len(rs) && (r.OverallScore != rs[i].ev.Evaluation.OverallScore || r.Submission.Content != rs[i].ev.Submission.Content || r.RoundNumber != rs[i].ev.RoundNumber) {
								t.Errorf("%s/%s round %d = %+v, want %+v", exec, team, r.RoundNumber, r, rs[i].ev)
							}
						}
					}
				}
			}
			stored := 0.0
			for _, r := range rankers {
				stored += r.metric(t, `ranker_events_total{outcome="stored"}`) + r.metric(t, `ranker_events_total{outcome="duplicate"}`)
			}
			if stored != float64(len(sends)) {
				t.Errorf("rankers handled %v events, want %d", stored, len(sends))
			}
			if replicas == 2 && (rankers[0].metric(t, `ranker_events_total{outcome="stored"}`) == 0 || rankers[1].metric(t, `ranker_events_total{outcome="stored"}`) == 0) {
				t.Logf("one replica did all the work (allowed, but the test shows less)")
			}
		})
	}
}

func mustMarshal(t testing.TB, p published) []byte {
	t.Helper()
	b, err := events.Marshal(p.id, "orchestrator/test", events.TypeEvaluationCompleted, p.ev.EvaluatedAt, p.ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitCommitted waits until the ranker consumer has acknowledged n messages.
func waitCommitted(t testing.TB, e *env, n int) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("the ranker to commit %d evaluations", n), func() (bool, string) {
		cons, err := e.js.Consumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker)
		if err != nil {
			return false, err.Error()
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream >= uint64(n), fmt.Sprintf("ack floor %d, delivered %d, pending %d, ack pending %d, redelivered %d",
			info.AckFloor.Stream, info.Delivered.Stream, info.NumPending, info.NumAckPending, info.NumRedelivered)
	})
}

func TestRankerAPIRejectsBadIdentifiers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	var body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	for _, path := range []string{
		"/v1/executions/bad.id/leaderboard",
		"/v1/executions/bad%20id/leaderboard",
		"/v1/executions/" + string(make([]byte, 0)) + "x/teams/t.1/history",
		"/v1/executions/ok/leaderboard?score_order=sideways",
	} {
		if code := ranker.getJSON(t, path, &body); code != http.StatusBadRequest || body.Code != "invalid_request" || body.Message == "" {
			t.Errorf("GET %s = %d %+v, want 400 invalid_request", path, code, body)
		}
	}
	// A long bad identifier is echoed as a short prefix; a path over the header limit is 431.
	long := strings.Repeat("x", 50_000) + "."
	if code := ranker.getJSON(t, "/v1/executions/"+long+"/leaderboard", &body); code != http.StatusBadRequest ||
		body.Message != `execution_id "`+strings.Repeat("x", 64)+`"… must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-'` {
		t.Errorf("50 KB identifier = %d, message of %d bytes: %.200s", code, len(body.Message), body.Message)
	}
	if code := ranker.getJSON(t, "/v1/executions/"+strings.Repeat("x", 900_000)+"/leaderboard", nil); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("900 KB path = %d, want 431", code)
	}
	var lb leaderboard
	if code := ranker.getJSON(t, "/v1/executions/never-seen/leaderboard", &lb); code != http.StatusOK || lb.Teams == nil || len(lb.Teams) != 0 || lb.ExecutionID != "never-seen" {
		t.Errorf("unknown execution = %d %+v, want 200 with an empty teams list", code, lb)
	}
	var h history
	if code := ranker.getJSON(t, "/v1/executions/never-seen/teams/t/history", &h); code != http.StatusOK || h.Rounds == nil || len(h.Rounds) != 0 {
		t.Errorf("unknown history = %d %+v, want 200 with an empty rounds list", code, h)
	}
	if code := ranker.getJSON(t, "/healthz", nil); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
}
