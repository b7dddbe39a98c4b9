package compose

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/pkg/events"
)

// TestContentFromChangesNothing: a prompt composed from the content of the rounds ContentFrom
// names only (the others with number, id and score, as the composer reads them) equals the one
// composed from every round's content, byte for byte and cut for cut: on every shipped round
// template, at several history_rounds (0 included), budgets from none to the tightest, with a
// team that skipped rounds.
func TestContentFromChangesNothing(t *testing.T) {
	l := testLibrary(t)
	for _, template := range []string{"team-round", "mixseek-team"} {
		for _, historyRounds := range []int{0, 1, 3, 20} {
			full := longTournament(template, 0)
			full.History = append(full.History[:2:2], full.History[4:]...) // rounds 3 and 4 skipped
			hr := historyRounds
			full.Request.Limits.HistoryRounds = &hr
			whole, err := l.Compose(context.Background(), full)
			if err != nil {
				t.Fatal(err)
			}
			for budget := whole.TokenEstimate; budget > 0; budget -= 97 {
				name := fmt.Sprintf("%s/history_rounds=%d/budget=%d", template, historyRounds, budget)
				in := full
				b := budget
				in.Request.Limits.MaxPromptTokens = &b
				want, wantErr := l.Compose(context.Background(), in)

				from := l.ContentFrom(in.Request, in.History)
				in.History = make([]events.TeamRound, len(full.History))
				for i, r := range full.History {
					if r.RoundNumber < from {
						r = events.TeamRound{RoundNumber: r.RoundNumber, EvaluationID: r.EvaluationID, OverallScore: r.OverallScore}
					}
					in.History[i] = r
				}
				got, gotErr := l.Compose(context.Background(), in)
				if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
					t.Fatalf("%s: error %v with every round's content, %v from round %d", name, wantErr, gotErr, from)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("%s: content from round %d changes the prompt (-every round +from round %d):\n%s", name, from, from, diff)
				}
			}
		}
	}
}
