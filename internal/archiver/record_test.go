package archiver

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// published stores bodies in a real PROMPTS on their subjects and returns the messages as a
// consumer receives them, in order.
func published(t *testing.T, subjects []string, bodies [][]byte) []jetstream.Msg {
	t.Helper()
	ctx := t.Context()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	for i, body := range bodies {
		if _, err := js.Publish(ctx, subjects[i], body); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(len(bodies))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
	}
	if len(msgs) != len(bodies) {
		t.Fatalf("fetched %d messages, want %d", len(msgs), len(bodies))
	}
	return msgs
}

func marshal(t *testing.T, id, eventType string, data any) []byte {
	t.Helper()
	body, err := events.Marshal(id, "composer/test", eventType, time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC), data)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestRecord reads real PROMPTS messages as the archive keeps them: the fields its row indexes,
// the body byte for byte; and says why a message is not a record.
func TestRecord(t *testing.T) {
	composed := events.PromptComposed{RequestID: "req-1", ExecutionID: "exec-1", TeamID: "team-a", TeamName: "A", RoundNumber: 3,
		Prompt: strings.Repeat("a long prompt \"quoted\" ", 400), Messages: []events.Message{{Role: "user", Content: "hi"}},
		PromptSHA256: "abc123", Template: events.TemplateRef{Name: "team-round", Version: 2}, TokenEstimate: 9,
		TokenEncoding: "o200k_base", Truncated: []events.Truncation{}, Inputs: events.ComposeInputs{EvaluationsSeq: 41}}
	failed := events.PromptFailed{RequestID: "req-2", ExecutionID: "exec-1", TeamID: "team-b", RoundNumber: 4,
		Code: events.CodeTemplateError, Message: "boom"}
	cases := []struct {
		name    string
		subject string
		body    []byte
		want    chstore.ArchivedPrompt // the fields besides the body, subject and stream's
		wantErr string
	}{
		{name: "composed", subject: events.PromptComposedSubject("exec-1", "team-a"), body: marshal(t, "p-1", events.TypePromptComposed, composed),
			want: chstore.ArchivedPrompt{EventID: "p-1", EventType: events.TypePromptComposed, RequestID: "req-1", ExecutionID: "exec-1", TeamID: "team-a",
				Round: 3, TemplateName: "team-round", TemplateVersion: 2, EvaluationsSeq: 41, PromptSHA256: "abc123"}},
		{name: "failed", subject: events.PromptFailedSubject("exec-1", "team-b"), body: marshal(t, "p-2", events.TypePromptFailed, failed),
			want: chstore.ArchivedPrompt{EventID: "p-2", EventType: events.TypePromptFailed, RequestID: "req-2", ExecutionID: "exec-1", TeamID: "team-b", Round: 4}},
		{name: "not JSON", subject: events.PromptComposedSubject("x", "t"), body: []byte(`{"not": "a cloudevent"`), wantErr: "not a CloudEvent"},
		{name: "another type", subject: events.PromptComposedSubject("x", "t"), body: marshal(t, "p-3", events.TypeEvaluationCompleted, map[string]any{"execution_id": "x"}),
			wantErr: `type "evaluation.completed" is not a prompt record`},
		{name: "no id", subject: events.PromptComposedSubject("x", "t"), body: marshal(t, "", events.TypePromptComposed, composed), wantErr: "a record without an id"},
		{name: "data of another shape", subject: events.PromptComposedSubject("x", "t"),
			body:    marshal(t, "p-4", events.TypePromptComposed, map[string]any{"execution_id": "x", "team_id": "t", "round_number": "three"}),
			wantErr: "prompt.composed data: "},
		{name: "no team", subject: events.PromptComposedSubject("x", "t"),
			body:    marshal(t, "p-5", events.TypePromptComposed, map[string]any{"execution_id": "x", "round_number": 1}),
			wantErr: "prompt.composed p-5 names no execution, team and round"},
	}
	subjects, bodies := make([]string, len(cases)), make([][]byte, len(cases))
	for i, c := range cases {
		subjects[i], bodies[i] = c.subject, c.body
	}
	msgs := published(t, subjects, bodies)
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := sink.Origin{Created: created, Era: 4}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := record(msgs[i], at)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("record = %v, want an error with %q", err, c.wantErr)
				}
				// Not a record: its row keeps its bytes at its position, for the audit log alone.
				row, why, ok := rowOf(msgs[i], at)
				stream := created.Format(time.RFC3339Nano)
				if !ok || why == nil || row.EventType != chstore.NotARecordType || row.ExecutionID != "" || !bytes.Equal(row.Body, c.body) ||
					row.Subject != c.subject || row.Seq != uint64(i+1) || row.Era != 4 || row.StreamCreated != stream || row.EventID != chstore.NotARecordID(stream, uint64(i+1)) {
					t.Errorf("rowOf = %+v, %v, %v: want the message's bytes at sequence %d, not a record", row, why, ok, i+1)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Body, c.body) || got.Subject != c.subject || got.Seq != uint64(i+1) || got.Era != 4 || got.StreamCreated != created.Format(time.RFC3339Nano) || got.Stored.IsZero() {
				t.Errorf("record kept body %d B (want %d), subject %q, seq %d, stream %q, stored %s", len(got.Body), len(c.body), got.Subject, got.Seq, got.StreamCreated, got.Stored)
			}
			got.Body, got.Subject, got.Seq, got.Era, got.StreamCreated, got.Stored = nil, "", 0, 0, "", time.Time{}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("record =\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
}

// TestIsRecordIsWhatTheArchiveKeeps: `podium audit check` expects the archive to hold exactly the
// messages the archiver keeps; it asks IsRecord, which is the archiver's own test. A CloudEvent of
// another type whose data looks like a prompt's is dead-lettered, not archived (a check that
// decoded it as a prompt expected it in the archive and named it missing).
func TestIsRecordIsWhatTheArchiveKeeps(t *testing.T) {
	composed := []byte(`{"specversion":"1.0","id":"a-1","source":"s","type":"prompt.composed","time":"2026-11-01T00:00:00Z",` +
		`"data":{"request_id":"r","execution_id":"e","team_id":"t","round_number":1,"prompt":"p"}}`)
	for _, c := range []struct {
		body []byte
		want bool
	}{
		{composed, true},
		{bytes.Replace(composed, []byte(`"prompt.composed"`), []byte(`"evaluation.completed"`), 1), false},
		{bytes.Replace(composed, []byte(`"round_number":1`), []byte(`"round_number":-1`), 1), false},
		{[]byte(`not json`), false},
	} {
		if got := IsRecord(c.body); got != c.want {
			t.Errorf("IsRecord(%.60s...) = %v, want %v", c.body, got, c.want)
		}
	}
}
