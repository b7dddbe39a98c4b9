package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

const goodEvaluation = `{
  "specversion": "1.0", "id": "ev-1", "source": "orchestrator/alpha", "type": "evaluation.completed",
  "time": "2026-11-21T10:00:00Z", "datacontenttype": "application/json", "unknown_attr": 1,
  "data": {
    "execution_id": "exec-7f3a", "team_id": "team-alpha", "team_name": "Alpha", "round_number": 2,
    "submission": {"content": "full text", "format": "md"},
    "evaluation": {"overall_score": 82.5, "metrics": [{"metric_name": "ClarityCoherence", "score": 80.0, "evaluator_comment": "clear"}], "feedback": null},
    "evaluated_at": "2026-11-21T19:00:00.123456789+09:00", "future_field": {"x": 1}
  }
}`

func TestParseEvaluationGood(t *testing.T) {
	ev, err := events.ParseEvaluation("evaluation.completed.exec-7f3a.team-alpha", []byte(goodEvaluation), events.DefaultMaxEventBytes)
	if err != nil {
		t.Fatal(err)
	}
	want := events.EvaluationCompleted{
		ExecutionID: "exec-7f3a", TeamID: "team-alpha", TeamName: "Alpha", RoundNumber: 2,
		Submission:  events.Submission{Content: "full text", Format: "md"},
		Evaluation:  events.Scores{OverallScore: 82.5, Metrics: []events.Metric{{MetricName: "ClarityCoherence", Score: 80, EvaluatorComment: "clear"}}},
		EvaluatedAt: time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC),
	}
	if !ev.Data.EvaluatedAt.Equal(want.EvaluatedAt) {
		t.Errorf("evaluated_at = %v, want %v", ev.Data.EvaluatedAt, want.EvaluatedAt)
	}
	ev.Data.EvaluatedAt = want.EvaluatedAt
	if diff := cmp.Diff(want, ev.Data); diff != "" {
		t.Errorf("data (-want +got):\n%s", diff)
	}
	if ev.ID != "ev-1" || ev.Source != "orchestrator/alpha" {
		t.Errorf("meta = %+v", ev.Meta)
	}
}

// mutate returns goodEvaluation with one change applied to its decoded form.
func mutate(t *testing.T, f func(env, data map[string]any)) []byte {
	t.Helper()
	var env map[string]any
	if err := json.Unmarshal([]byte(goodEvaluation), &env); err != nil {
		t.Fatal(err)
	}
	f(env, env["data"].(map[string]any))
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseEvaluationReportsEveryProblemWithItsPath(t *testing.T) {
	const subject = "evaluation.completed.exec-7f3a.team-alpha"
	tests := []struct {
		name    string
		subject string
		body    []byte
		want    []events.Problem
	}{
		{"not JSON", subject, []byte(`{"a":`), []events.Problem{{"", "body is not JSON: unexpected EOF"}}},
		{"trailing data", subject, []byte(`{} {}`), []events.Problem{{"", "body has data after the JSON value"}}},
		{"array", subject, []byte(`[]`), []events.Problem{{"", "body must be a JSON object (a CloudEvent in structured mode), got an array"}}},
		{"invalid UTF-8", subject, []byte("{\"id\":\"\xff\"}"), []events.Problem{{"", "body is not valid UTF-8"}}},
		{"too big", subject, []byte(goodEvaluation), []events.Problem{{"", fmt.Sprintf("body is %d bytes, over the limit of 100 (MAX_EVENT_BYTES)", len(goodEvaluation))}}},
		{"envelope", subject, mutate(t, func(env, _ map[string]any) {
			env["specversion"] = "0.3"
			env["id"] = ""
			env["type"] = "round.requested"
			env["time"] = "yesterday"
			env["datacontenttype"] = "text/plain"
			delete(env, "source")
		}), []events.Problem{
			{"specversion", `must be "1.0", got "0.3"`},
			{"id", "must be 1-128 printable ASCII characters"},
			{"source", "is required"},
			{"type", `must be "evaluation.completed" on subject "evaluation.completed.exec-7f3a.team-alpha", got "round.requested"`},
			{"time", `must be an RFC 3339 time with an offset, like 2026-11-21T10:00:00Z, got "yesterday"`},
			{"datacontenttype", `must be "application/json" when present, got "text/plain"`},
		}},
		{"missing data", subject, mutate(t, func(env, _ map[string]any) { delete(env, "data") }), []events.Problem{{"data", "is required"}}},
		{"data fields", subject, mutate(t, func(_, d map[string]any) {
			d["execution_id"] = "exec.7f3a"
			d["team_id"] = "team alpha"
			d["team_name"] = ""
			d["round_number"] = 0
			d["submission"] = "text"
			ev := d["evaluation"].(map[string]any)
			ev["overall_score"] = "high"
			ev["metrics"] = []any{
				map[string]any{"metric_name": "A", "score": json.Number("1e999")},
				map[string]any{"metric_name": "A", "score": 1, "evaluator_comment": 5},
				"x",
			}
			delete(d, "evaluated_at")
		}), []events.Problem{
			{"data.execution_id", `"exec.7f3a" must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-'`},
			{"data.team_id", `"team alpha" must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-'`},
			{"data.team_name", "must not be empty"},
			{"data.round_number", "must be an integer from 1 to 2147483647, got 0"},
			{"data.submission", "must be an object, got a string"},
			{"data.evaluation.overall_score", "must be a number, got a string"},
			{"data.evaluation.metrics[0].score", "must be a finite number, got 1e999"},
			{"data.evaluation.metrics[1].metric_name", `"A" repeats data.evaluation.metrics[0]; metric names must be unique`},
			{"data.evaluation.metrics[1].evaluator_comment", "must be a string, got a number"},
			{"data.evaluation.metrics[2]", "must be an object, got a string"},
			{"data.evaluated_at", "is required"},
		}},
		{"subject mismatch", "evaluation.completed.exec-7f3a.team-beta", []byte(goodEvaluation),
			[]events.Problem{{"data.team_id", `is "team-alpha" but the subject names "team-beta"`}}},
		{"subject shape", "evaluation.completed.exec-7f3a", []byte(goodEvaluation),
			[]events.Problem{{"subject", `subject "evaluation.completed.exec-7f3a" must be evaluation.completed.<execution_id>.<team_id>`}}},
		{"fractional round", subject, mutate(t, func(_, d map[string]any) { d["round_number"] = 1.5 }),
			[]events.Problem{{"data.round_number", "must be an integer from 1 to 2147483647, got 1.5"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit := events.DefaultMaxEventBytes
			if tt.name == "too big" {
				limit = 100
			}
			_, err := events.ParseEvaluation(tt.subject, tt.body, limit)
			ie, ok := err.(*events.InvalidError)
			if !ok {
				t.Fatalf("error = %v, want *InvalidError", err)
			}
			if diff := cmp.Diff(tt.want, ie.Problems); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			if !events.IsInvalid(err) {
				t.Errorf("IsInvalid(%v) = false", err)
			}
		})
	}
}

func TestParseRoundRequest(t *testing.T) {
	body := `{"specversion":"1.0","id":"r-1","source":"orchestrator/alpha","type":"round.requested","time":"2026-11-21T10:00:00+09:00",
	"data":{"execution_id":"e","team_id":"t","team_name":"T","round_number":3,"user_prompt":"task","template":"team-round@4",
	"model":"phi-4-mini","timezone":"Asia/Tokyo","max_rounds":5,"score_order":"asc",
	"limits":{"history_rounds":2,"max_prompt_tokens":100},"vars":{"n":1.50,"s":"x"}}}`
	rr, err := events.ParseRoundRequest("round.requested.e.t", []byte(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Data.ScoreOrder != events.Asc || rr.Data.MaxRounds != 5 || *rr.Data.Limits.HistoryRounds != 2 || rr.Data.Limits.PreviewChars != nil {
		t.Errorf("parsed %+v", rr.Data)
	}
	if n, ok := rr.Data.Vars["n"].(json.Number); !ok || n != "1.50" {
		t.Errorf("vars.n = %#v, want the number as sent", rr.Data.Vars["n"])
	}
	bad := strings.NewReplacer(`"team-round@4"`, `"team-round@x"`, `"asc"`, `"up"`, `"history_rounds":2`, `"history_rounds":-1`, `"user_prompt":"task"`, `"user_prompt":""`).Replace(body)
	_, err = events.ParseRoundRequest("round.requested.e.t", []byte(bad), 0)
	ie, _ := err.(*events.InvalidError)
	var paths []string
	if ie != nil {
		for _, p := range ie.Problems {
			paths = append(paths, p.Path)
		}
	}
	if diff := cmp.Diff([]string{"data.user_prompt", "data.template", "data.score_order", "data.limits.history_rounds"}, paths); diff != "" {
		t.Errorf("problem paths (-want +got):\n%s", diff)
	}
}

func TestSubjects(t *testing.T) {
	if got := events.EvaluationSubject("e", "t"); got != "evaluation.completed.e.t" {
		t.Error(got)
	}
	if got := events.DeadLetterSubject(events.RoundSubject("e", "t")); got != "deadletter.round.requested.e.t" {
		t.Error(got)
	}
	addr, err := events.ParseTeamSubject(events.TypePromptFailed, "prompt.failed.e-1.t_2")
	if err != nil || addr.ExecutionID != "e-1" || addr.TeamID != "t_2" {
		t.Errorf("ParseTeamSubject = %+v, %v", addr, err)
	}
	for _, bad := range []string{"prompt.failed.e", "prompt.failed.e.t.x", "prompt.composed.e.t", "prompt.failed..t"} {
		if _, err := events.ParseTeamSubject(events.TypePromptFailed, bad); err == nil {
			t.Errorf("ParseTeamSubject(%q) accepted it", bad)
		}
	}
	if events.ValidIdentifier(strings.Repeat("a", 129)) || !events.ValidIdentifier(strings.Repeat("a", 128)) {
		t.Error("identifier length bound is not 128")
	}
	if a, b := events.PromptEventID("req-1"), events.PromptEventID("req-1"); a != b || len(a) > 128 || a == events.PromptEventID("req-2") {
		t.Errorf("PromptEventID not stable and distinct: %s %s", a, b)
	}
}

func TestEnsureStreamsIsIdempotentAndFollowsTheContract(t *testing.T) {
	ns := testenv.NATS(t)
	_, js := testenv.JetStream(t, ns)
	ctx := context.Background()
	all := []string{events.StreamEvaluations, events.StreamRounds, events.StreamPrompts, events.StreamLeaderboards, events.StreamDeadLetter}
	age := 72 * time.Hour
	opts := events.StreamOptions{Replicas: 1, Prompts: events.Retention{MaxAge: &age}, StateMaxIdle: 168 * time.Hour}
	if err := events.EnsureStreams(ctx, js, opts, all...); err != nil {
		t.Fatal(err)
	}
	// Again, as every start does: the streams are as the configuration wants them, so nothing
	// is updated (a stream update is not free on a cluster).
	nc, _ := testenv.JetStream(t, ns)
	var updates atomic.Int32
	sub, err := nc.Subscribe("$JS.API.STREAM.UPDATE.>", func(m *nats.Msg) { updates.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(ctx, js, opts, all...); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := updates.Load(); n != 0 {
		t.Errorf("a second EnsureStreams updated streams %d times, want 0", n)
	}
	prompts, err := js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := prompts.CachedInfo().Config
	if !cfg.DenyDelete || !cfg.DenyPurge || cfg.Storage != jetstream.FileStorage || cfg.MaxAge != 72*time.Hour || cfg.Duplicates != 10*time.Minute ||
		cfg.Compression != jetstream.S2Compression {
		t.Errorf("PROMPTS config = %+v", cfg)
	}
	if err := prompts.Purge(ctx); err == nil {
		t.Error("PROMPTS accepted a purge")
	}
	lb, _ := js.Stream(ctx, events.StreamLeaderboards)
	if c := lb.CachedInfo().Config; c.MaxMsgsPerSubject != 1 || c.Duplicates != 2*time.Minute || c.MaxAge != 168*time.Hour {
		t.Errorf("LEADERBOARDS config = %+v", c)
	}
	// A duplicate id within the window is stored once.
	for range 2 {
		if _, err := events.Publish(ctx, js, "prompt.composed.e.t", "same-id", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	info, _ := prompts.Info(ctx)
	if info.State.Msgs != 1 {
		t.Errorf("PROMPTS holds %d messages after a duplicate publish, want 1", info.State.Msgs)
	}
}

// TestEnsureStreamsLeavesWhatTheConfigurationDoesNotOwn: an operator's edit of a limit the
// configuration leaves unset survives every start; a limit the configuration sets is applied, and
// nothing else the operator set changes with it.
func TestEnsureStreamsLeavesWhatTheConfigurationDoesNotOwn(t *testing.T) {
	_, js := testenv.JetStream(t, testenv.NATS(t))
	ctx := t.Context()
	get := func(name string) jetstream.StreamConfig {
		t.Helper()
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config
	}
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamPrompts, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	if c := get(events.StreamPrompts); c.MaxAge != 0 || c.MaxBytes != -1 {
		t.Fatalf("a new PROMPTS without limits: max_age %s, max_bytes %d", c.MaxAge, c.MaxBytes)
	}
	// The operator edits by hand.
	edited := get(events.StreamPrompts)
	edited.MaxAge, edited.MaxBytes, edited.Discard = 48*time.Hour, 1<<30, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, edited); err != nil {
		t.Fatal(err)
	}
	evEdited := get(events.StreamEvaluations)
	evEdited.MaxMsgSize, evEdited.Compression = 2<<20, jetstream.S2Compression
	if _, err := js.UpdateStream(ctx, evEdited); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a restart, and another
		if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamPrompts, events.StreamEvaluations); err != nil {
			t.Fatal(err)
		}
	}
	if c := get(events.StreamPrompts); c.MaxAge != 48*time.Hour || c.MaxBytes != 1<<30 || c.Discard != jetstream.DiscardNew {
		t.Errorf("the operator's PROMPTS limits were reverted: max_age %s, max_bytes %d, discard %v", c.MaxAge, c.MaxBytes, c.Discard)
	}
	if c := get(events.StreamEvaluations); c.MaxMsgSize != 2<<20 || c.Compression != jetstream.S2Compression {
		t.Errorf("the operator's EVALUATIONS max_msg_size or compression was reverted: %d, %v", c.MaxMsgSize, c.Compression)
	}
	// The configuration sets the age: applied, the bytes and discard policy left as they were.
	age := 96 * time.Hour
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{Prompts: events.Retention{MaxAge: &age}}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	if c := get(events.StreamPrompts); c.MaxAge != 96*time.Hour || c.MaxBytes != 1<<30 || c.Discard != jetstream.DiscardNew || !c.DenyPurge {
		t.Errorf("PROMPTS after PROMPTS_MAX_AGE=96h: %+v", c)
	}
	// A bound set to 0 is no bound.
	var none int64
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{Prompts: events.Retention{MaxBytes: &none}}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	if c := get(events.StreamPrompts); c.MaxBytes != -1 || c.MaxAge != 96*time.Hour {
		t.Errorf("PROMPTS after PROMPTS_MAX_BYTES=0: max_bytes %d, max_age %s", c.MaxBytes, c.MaxAge)
	}
	// An idle time shorter than the duplicate window narrows the window, as the server requires.
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{StateMaxIdle: 30 * time.Second}, events.StreamLeaderboards); err != nil {
		t.Fatal(err)
	}
	if c := get(events.StreamLeaderboards); c.MaxAge != 30*time.Second || c.Duplicates != 30*time.Second {
		t.Errorf("LEADERBOARDS with STATE_MAX_IDLE=30s: max_age %s, duplicates %s", c.MaxAge, c.Duplicates)
	}
}

func TestDeadLetterCopiesBytesAndHeaders(t *testing.T) {
	ns := testenv.NATS(t)
	_, js := testenv.JetStream(t, ns)
	ctx := context.Background()
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamEvaluations, events.StreamDeadLetter); err != nil {
		t.Fatal(err)
	}
	body := []byte("{broken \xff")
	m := nats.NewMsg("evaluation.completed.e.t")
	m.Data = body
	m.Header.Set("X-Trace", "abc")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvaluations, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a redelivered poison message is stored once
		if err := events.DeadLetter(ctx, js, msg, "bad\nreason"); err != nil {
			t.Fatal(err)
		}
	}
	dl, err := js.Stream(ctx, events.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	got, err := dl.GetLastMsgForSubject(ctx, "deadletter.evaluation.completed.e.t")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != string(body) || got.Header.Get("Dead-Reason") != "bad reason" || got.Header.Get("Dead-Stream") != "EVALUATIONS" || got.Header.Get("Dead-Sequence") != "1" || got.Header.Get("X-Trace") != "abc" {
		t.Errorf("dead letter = %q %v", got.Data, got.Header)
	}
	if info, _ := dl.Info(ctx); info.State.Msgs != 1 {
		t.Errorf("DEADLETTER holds %d messages, want 1", info.State.Msgs)
	}
}

// BenchmarkParseEvaluation measures validation of a 2 KiB evaluation.completed, the ranker's
// per-event CPU cost before ClickHouse.
func BenchmarkParseEvaluation(b *testing.B) {
	body := strings.Replace(goodEvaluation, `"full text"`, `"`+strings.Repeat("x", 1400)+`"`, 1)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.ParseEvaluation("evaluation.completed.exec-7f3a.team-alpha", []byte(body), events.DefaultMaxEventBytes); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRenderRequestSequence: evaluations_seq is read exactly from its text, over the whole
// uint64 range, and anything else is a clear error.
func TestRenderRequestSequence(t *testing.T) {
	base := `{"execution_id":"e","team_id":"t","team_name":"T","round_number":1,"user_prompt":"p"`
	for _, tt := range []struct {
		seq     string
		want    uint64
		wantErr string
	}{
		{"0", 0, ""},
		{"9007199254740993", 9007199254740993, ""},
		{"9223372036854775807", 9223372036854775807, ""},
		{"18446744073709551615", 18446744073709551615, ""},
		{"18446744073709551616", 0, "evaluations_seq: must be a whole number from 0 to 18446744073709551615, got 18446744073709551616"},
		{"-1", 0, "evaluations_seq: must be a whole number from 0 to 18446744073709551615, got -1"},
		{"1.5", 0, "evaluations_seq: must be a whole number"},
		{`"7"`, 0, "evaluations_seq: must be a whole number from 0 to 18446744073709551615, got a string"},
		{strings.Repeat("9", 1000), 0, "got " + strings.Repeat("9", 64) + "…"},
	} {
		r, err := events.ParseRenderRequest([]byte(base+`,"evaluations_seq":`+tt.seq+`}`), events.DefaultMaxEventBytes)
		switch {
		case tt.wantErr == "" && (err != nil || r.EvaluationsSeq == nil || *r.EvaluationsSeq != tt.want):
			t.Errorf("%s: got %v, %v; want %d", tt.seq, r.EvaluationsSeq, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: error %v, want %q", tt.seq, err, tt.wantErr)
		}
	}
	if r, err := events.ParseRenderRequest([]byte(base+`}`), events.DefaultMaxEventBytes); err != nil || r.EvaluationsSeq != nil {
		t.Errorf("without evaluations_seq: %v, %v; want none", r.EvaluationsSeq, err)
	}
}

// TestMarshalWritesTextAsItIs: an event holds "<", ">" and "&" as themselves, as the render API
// writes them, so the bytes of a prompt are the same in both.
func TestMarshalWritesTextAsItIs(t *testing.T) {
	b, err := events.Marshal("id", "test", events.TypePromptComposed, time.Unix(0, 0), map[string]string{"prompt": "a <b> & c"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"prompt":"a <b> & c"`) || strings.HasSuffix(string(b), "\n") {
		t.Errorf("marshalled %s", b)
	}
}

// TestParseReference: the one rule of a template reference, which validation, the composer, the
// console, the CLI and the verifier share.
func TestParseReference(t *testing.T) {
	tests := []struct {
		in   string
		want events.Reference
		bad  bool
	}{
		{in: "team-round", want: events.Reference{Name: "team-round"}},
		{in: "team-round@5", want: events.Reference{Name: "team-round", Version: 5}},
		{in: "team-round:production", want: events.Reference{Name: "team-round", Label: "production"}},
		{in: "team-round:latest", want: events.Reference{Name: "team-round", Label: "latest"}},
		{in: "team-round@latest", bad: true}, // latest is a label
		{in: "team-round@0", bad: true},
		{in: "team-round@05", bad: true},
		{in: "team-round@+5", bad: true},
		{in: "team-round@", bad: true},
		{in: "team-round:", bad: true},
		{in: "team round", bad: true},
		{in: "@5", bad: true},
		{in: "a:b:c", bad: true},
	}
	for _, tt := range tests {
		got, err := events.ParseReference(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("ParseReference(%q) = %+v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want || got.String() != tt.in {
			t.Errorf("ParseReference(%q) = %+v (%s), %v; want %+v", tt.in, got, got.String(), err, tt.want)
		}
	}
}
