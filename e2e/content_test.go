package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// TestContentFromTheStreamIsWhatClickHouseHolds: the composer reads each evaluation's content
// from the EVALUATIONS stream by sequence; podium prompts verify renders every record again
// from ClickHouse's rows. Through a tournament with replays of an id under another body (the
// first copy counts), re-evaluations and every offset, both give the same bytes, on the template
// that prints every round (mixseek-team) and on the default. A message deleted from the stream
// is read from ClickHouse instead, and the prompt is the same.
func TestContentFromTheStreamIsWhatClickHouseHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	sends, firstByID := tournament(23, 4, 5, 4)
	publishAll(t, e, sends, 0, len(sends))
	waitCommitted(t, e, len(sends))
	_, latest := truth(firstByID, false)

	n := 0
	for exec, teams := range latest {
		for team, rounds := range teams {
			last := rounds[len(rounds)-1].ev.RoundNumber
			for i, template := range []string{"mixseek-team", "team-round"} {
				e.requestRound(fmt.Sprintf("req-%s-%s-%d", exec, team, i), events.RoundRequested{ExecutionID: exec, TeamID: team,
					TeamName: "T", RoundNumber: last + 1, UserPrompt: "Next.", Template: template}, t0.Add(time.Hour))
				n++
			}
		}
	}
	got := e.answers("prompt.>", n, 60*time.Second)
	for id, a := range got {
		if !a.ok() {
			t.Errorf("%s: %s %+v", id, a.subject, a.failed)
		}
	}
	if out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", "exec-0"); code != 0 {
		t.Errorf("verify exec-0 (content from ClickHouse) against the published prompts (content from the stream): exit %d\n%s", code, out)
	}
	for _, exec := range []string{"exec-1", "exec-2", "exec-3"} {
		if out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", exec); code != 0 {
			t.Errorf("verify %s: exit %d\n%s", exec, code, out)
		}
	}
	if stream := composer.metric(t, `composer_content_reads_total{source="stream"}`); stream == 0 || composer.metric(t, `composer_content_reads_total{source="clickhouse"}`) != 0 {
		t.Errorf("content reads: stream %v, clickhouse %v; want every one from the stream", stream, composer.metric(t, `composer_content_reads_total{source="clickhouse"}`))
	}

	// An operator deletes one of a team's evaluations from the stream: that team's content comes
	// from ClickHouse, and the prompt is what it was.
	var exec, team string
	for x, teams := range latest {
		for tm := range teams {
			if exec == "" || x+tm < exec+team {
				exec, team = x, tm
			}
		}
	}
	rounds := latest[exec][team]
	first := rounds[0]
	var seq uint64
	stream, err := e.js.Stream(t.Context(), events.StreamEvaluations)
	if err != nil {
		t.Fatal(err)
	}
	for s := uint64(1); s <= uint64(len(sends)); s++ {
		msg, err := stream.GetMsg(t.Context(), s)
		if err == nil && strings.Contains(string(msg.Data), `"id":"`+first.id+`"`) {
			seq = s
			break
		}
	}
	if seq == 0 {
		t.Fatalf("evaluation %s not found in the stream", first.id)
	}
	if err := stream.DeleteMsg(t.Context(), seq); err != nil {
		t.Fatal(err)
	}
	before := got[fmt.Sprintf("req-%s-%s-0", exec, team)]
	e.requestRound("req-after-delete", events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "T",
		RoundNumber: rounds[len(rounds)-1].ev.RoundNumber + 1, UserPrompt: "Next.", Template: "mixseek-team"}, t0.Add(time.Hour))
	after := e.answers("prompt.>", n+1, 30*time.Second)["req-after-delete"]
	if !after.ok() || after.composed.Prompt != before.composed.Prompt || !slices.Equal(after.composed.Inputs.EvaluationIDs, before.composed.Inputs.EvaluationIDs) {
		t.Errorf("after deleting sequence %d (%s) from the stream the prompt changed:\nbefore %q\nafter  %q (%s %+v)", seq, first.id, before.composed.Prompt, after.composed.Prompt, after.subject, after.failed)
	}
	if fell := composer.metric(t, `composer_content_reads_total{source="clickhouse"}`); fell != 1 {
		t.Errorf("content reads from ClickHouse after the deletion: %v, want 1", fell)
	}
}
