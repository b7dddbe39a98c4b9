package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/podium-llm/podium/pkg/events"
)

// TestBoardAsOfMySequence: an orchestrator publishes evaluations, some of them replays of earlier
// ones (which do not move the board's evaluations_seq), and reads the leaderboard as of the
// sequence of its last publish acknowledgement: the answer counts every evaluation it published,
// as the test recounts them, and matches schemas/api/leaderboard.schema.json. A sequence the stream
// never held answers 409; bad parameters 400.
func TestBoardAsOfMySequence(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	schema := compileSchema(t, filepath.Join("..", "schemas", "api", "leaderboard.schema.json"))

	best := map[string]float64{}
	rounds := map[string]int{}
	var last uint64
	for round := 1; round <= 3; round++ {
		for i, team := range []string{"a", "b", "c", "d"} {
			score := float64((i*31+round*17)%100) + 0.25
			best[team], rounds[team] = max(best[team], score), round
			last = e.publishEvaluation(fmt.Sprintf("asof-%s-%d", team, round), evaluation("asof", team, "Team "+team, round, score, "work", t0))
		}
		// Every round ends with a replay of an earlier evaluation under its own id: the stream
		// stores it (outside the duplicate window, as an orchestrator's retry after a restart is)
		// and the ranker acknowledges it without counting it again.
		last = e.publishRaw("evaluation.completed.asof.a", "asof-replay-"+fmt.Sprint(round), mustEvent(t, "asof-a-1", evaluation("asof", "a", "Team a", 1, 0.25, "work", t0)))
	}
	var lb leaderboard
	status, body := get(t, ranker, fmt.Sprintf("/v1/executions/asof/leaderboard?as_of=%d&wait=30s", last))
	if status != http.StatusOK {
		t.Fatalf("as_of %d: %d %s", last, status, body)
	}
	if err := json.Unmarshal(body, &lb); err != nil {
		t.Fatal(err)
	}
	if len(lb.Teams) != len(best) {
		t.Fatalf("as_of %d: %d teams, want %d: %s", last, len(lb.Teams), len(best), body)
	}
	for _, row := range lb.Teams {
		if row.BestScore != best[row.TeamID] || row.Rounds != rounds[row.TeamID] {
			t.Errorf("%s: best %v over %d rounds, published best %v over %d", row.TeamID, row.BestScore, row.Rounds, best[row.TeamID], rounds[row.TeamID])
		}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := schema.Validate(doc); err != nil {
		t.Errorf("the leaderboard does not match its schema: %v\n%s", err, body)
	}
	// The same read over NATS (podium.leaderboard): the same board, byte for byte but for field
	// order, and the same refusals, as micro errors.
	msg, err := e.nc.Request("podium.leaderboard", []byte(fmt.Sprintf(`{"execution_id":"asof","as_of":%d,"wait":"30s"}`, last)), 40*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var overNATS leaderboard
	if err := json.Unmarshal(msg.Data, &overNATS); err != nil || msg.Header.Get("Nats-Service-Error-Code") != "" {
		t.Fatalf("podium.leaderboard: %v %s %v", err, msg.Data, msg.Header)
	}
	if !reflect.DeepEqual(overNATS, lb) {
		t.Errorf("podium.leaderboard answered %+v, GET %+v", overNATS, lb)
	}
	for request, want := range map[string]string{
		fmt.Sprintf(`{"execution_id":"asof","as_of":%d}`, last+1000): "409",
		`{"execution_id":"asof","wait":"1s"}`:                        "400",
		`{"execution_id":"as of"}`:                                   "400",
		`{"execution_id":"asof","extra":1}`:                          "400",
		`not json`:                                                   "400",
	} {
		msg, err := e.nc.Request("podium.leaderboard", []byte(request), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := msg.Header.Get("Nats-Service-Error-Code"); got != want {
			t.Errorf("podium.leaderboard %s: error code %q (%s), want %s", request, got, msg.Data, want)
		}
	}
	for query, want := range map[string]int{
		fmt.Sprintf("as_of=%d", last+1000): http.StatusConflict,
		"as_of=0":                          http.StatusBadRequest,
		"as_of=x":                          http.StatusBadRequest,
		"as_of=1&wait=2h":                  http.StatusBadRequest,
		"wait=1s":                          http.StatusBadRequest,
	} {
		if status, body := get(t, ranker, "/v1/executions/asof/leaderboard?"+query); status != want {
			t.Errorf("?%s: %d %s, want %d", query, status, body, want)
		}
	}
}

// mustEvent is an evaluation.completed body with event id id.
func mustEvent(t *testing.T, id string, ev any) []byte {
	t.Helper()
	body, err := events.Marshal(id, "orchestrator/test", events.TypeEvaluationCompleted, t0, ev)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// get is an HTTP GET of a service's path: its status and body.
func get(t *testing.T, p *proc, path string) (int, []byte) {
	t.Helper()
	status, body := getPage(t, "http://"+p.addr+path)
	return status, []byte(body)
}

func compileSchema(t *testing.T, path string) *jsonschema.Schema {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(path, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
