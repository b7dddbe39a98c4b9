package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// lastBoard is the last leaderboard.updated LEADERBOARDS holds for exec (ok false while none).
func lastBoard(t *testing.T, e *env, exec string) (events.LeaderboardUpdated, bool) {
	t.Helper()
	st, err := e.js.Stream(t.Context(), events.StreamLeaderboards)
	if err != nil {
		return events.LeaderboardUpdated{}, false
	}
	msg, err := st.GetLastMsgForSubject(t.Context(), events.LeaderboardSubject(exec))
	if err != nil {
		return events.LeaderboardUpdated{}, false
	}
	var lu events.LeaderboardUpdated
	dataOf(t, msg.Data, &lu)
	return lu, true
}

// TestLeaderboardsDeletedIsMadeAgain: LEADERBOARDS deleted under a running ranker. Announcing
// fails; the ranker turns unready naming leaderboards (never "ready" while what it announces goes
// nowhere). Under MANAGE_STREAMS it makes the stream again a second after the first failure and
// the board of the evaluation that came meanwhile is announced; an operator-owned deployment stays
// unready until the operator makes the stream, then announces.
func TestLeaderboardsDeletedIsMadeAgain(t *testing.T) {
	t.Parallel()
	for _, managed := range []bool{true, false} {
		t.Run(fmt.Sprintf("managed=%v", managed), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if !managed {
				// The operator made the streams; the ranker leaves them alone.
				if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamEvaluations, events.StreamLeaderboards, events.StreamDeadLetter); err != nil {
					t.Fatal(err)
				}
			}
			ranker := e.start("ranker", fmt.Sprintf("MANAGE_STREAMS=%v", managed))
			exec := "boards"
			e.publishEvaluation("first", evaluation(exec, "t1", "Team t1", 1, 40, "first work", t0))
			testenv.WaitFor(t, 30*time.Second, "the first board announced", func() (bool, string) {
				lu, ok := lastBoard(t, e, exec)
				return ok && len(lu.Leaderboard) == 1, fmt.Sprintf("%+v", lu)
			})

			if err := e.js.DeleteStream(t.Context(), events.StreamLeaderboards); err != nil {
				t.Fatal(err)
			}
			deleted := time.Now()
			second := e.publishEvaluation("second", evaluation(exec, "t2", "Team t2", 1, 70, "second work", t0))
			var unready string
			testenv.WaitFor(t, 30*time.Second, "the ranker unready naming leaderboards", func() (bool, string) {
				code, body := readiness(ranker)
				if code == http.StatusServiceUnavailable && strings.Contains(body, `"leaderboards"`) {
					var r struct{ Failing map[string]string }
					_ = json.Unmarshal([]byte(body), &r)
					unready = r.Failing["leaderboards"]
					return true, ""
				}
				_, ok := lastBoard(t, e, exec)
				return false, fmt.Sprintf("%d %s (stream back: %v)", code, body, ok)
			})
			if !managed {
				// Not the ranker's to make: it stays unready until the operator does.
				holds(t, 2*time.Second, "the ranker unready while LEADERBOARDS is missing", func() (bool, string) {
					code, body := readiness(ranker)
					return code == http.StatusServiceUnavailable, fmt.Sprintf("%d %s", code, body)
				})
				if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamLeaderboards); err != nil {
					t.Fatal(err)
				}
			}
			testenv.WaitFor(t, 30*time.Second, "the board with the second evaluation announced", func() (bool, string) {
				lu, ok := lastBoard(t, e, exec)
				return ok && len(lu.Leaderboard) == 2 && lu.EvaluationsSeq == second, fmt.Sprintf("%+v", lu)
			})
			waitReadiness(t, ranker, http.StatusOK, 30*time.Second)
			t.Logf("LEADERBOARDS deleted (managed %v): unready (%q), announced again and ready %s after the delete",
				managed, unready, time.Since(deleted).Round(time.Millisecond))
		})
	}
}
