package console

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// TestReadAnswer reads what encoding/json would, from records as the composer writes them and
// from records no composer wrote.
func TestReadAnswer(t *testing.T) {
	pos := 2
	composed, err := events.Marshal("id-1", "composer/x", events.TypePromptComposed, time.Unix(0, 0), events.PromptComposed{
		TeamID: "team-a", RoundNumber: 3, Prompt: `a "quoted" {prompt} with \ and ` + "\u2028 日本", TokenEstimate: 1234,
		Truncated: []events.Truncation{{Section: "history", Detail: "x"}, {Section: "leaderboard", Detail: "y"}},
		Inputs:    events.ComposeInputs{TeamPosition: &pos, Leaderboard: []events.LeaderboardRow{{TeamID: "team-b"}}}})
	if err != nil {
		t.Fatal(err)
	}
	failed, _ := events.Marshal("id-2", "composer/x", events.TypePromptFailed, time.Unix(0, 0),
		events.PromptFailed{TeamID: "team-b", RoundNumber: 7, Code: "budget_exceeded", Message: "too long"})
	r := newAnswerReader() // one reader for every case, as a catch-up reads its records
	for _, tt := range []struct {
		name string
		body string
		want answer
		bad  bool
	}{
		{"composed", string(composed), answer{TeamID: "team-a", Round: 3, Tokens: 1234, Cuts: 2}, false},
		{"failed", string(failed), answer{TeamID: "team-b", Round: 7, Code: "budget_exceeded"}, false},
		{"data first, fields in any order", `{"data":{"truncated":[],"round_number":2,"team_id":"t"},"type":"x"}`, answer{TeamID: "t", Round: 2}, false},
		{"wrong types are zero", `{"data":{"team_id":5,"round_number":"2","token_estimate":1.5,"truncated":{}}}`, answer{}, false},
		{"huge round", `{"data":{"team_id":"t","round_number":1e300}}`, answer{TeamID: "t"}, false},
		{"data not an object", `{"data":[1,2]}`, answer{}, false},
		{"not an object", `[]`, answer{}, true},
		{"cut short", `{"data":{"team_id":"t"`, answer{}, true},
		{"not JSON", `<html>`, answer{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.read([]byte(tt.body))
			if (err != nil) != tt.bad {
				t.Fatalf("error %v, want error %v", err, tt.bad)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if !tt.bad && json.Valid([]byte(tt.body)) != true {
				t.Error("a case that should be valid JSON is not")
			}
		})
	}
}
