// Package audit reads the PROMPTS audit back and checks it: the records of a team or an
// execution (from the prompts archive in ClickHouse, and the stream's tail not archived yet), the
// latest of a round, and the verifier that renders a record again from its own
// request, template version and evaluations_seq. The podium CLI and the console share it, so a
// record verified in the browser is verified exactly as `podium prompts verify` does.
package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// Record is one prompt.composed read back from the PROMPTS audit stream or its archive.
type Record struct {
	Seq         uint64
	Stored      time.Time // when the stream stored it
	EventID     string
	Subject     string
	Raw         []byte // the CloudEvent as stored
	Data        events.PromptComposed
	TraceParent string // the envelope's traceparent: the composer's span that made it
	Archived    bool   // read from the prompts archive in ClickHouse, not from the stream
	// Failed is set on a prompt.failed record (read only where a Query asks for them): Data then
	// holds its request, execution, team and round alone.
	Failed *events.PromptFailed
}

// record decodes a message of PROMPTS with its place in the stream.
func record(msg jetstream.Msg) (Record, error) {
	md, err := msg.Metadata()
	if err != nil {
		return Record{}, fmt.Errorf("record %s: %w", msg.Subject(), err)
	}
	r, err := Decode(msg.Subject(), msg.Data())
	if err != nil {
		return Record{}, err
	}
	r.Seq, r.Stored, r.Raw = md.Sequence.Stream, md.Timestamp, bytes.Clone(msg.Data())
	return r, nil
}

// Decode reads one prompt.composed CloudEvent as stored on subject.
func Decode(subject string, body []byte) (Record, error) {
	var env events.Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Record{}, fmt.Errorf("record %s: %w", subject, err)
	}
	if env.Type == events.TypePromptFailed {
		var pf events.PromptFailed
		if err := json.Unmarshal(env.Data, &pf); err != nil {
			return Record{}, fmt.Errorf("record %s: %w", subject, err)
		}
		return Record{EventID: env.ID, Subject: subject, Failed: &pf, TraceParent: env.TraceParent, Data: events.PromptComposed{
			RequestID: pf.RequestID, ExecutionID: pf.ExecutionID, TeamID: pf.TeamID, RoundNumber: pf.RoundNumber}}, nil
	}
	// Numbers as written, as the composer reads a request's vars: 0.50 stays 0.50.
	var pc events.PromptComposed
	dec := json.NewDecoder(bytes.NewReader(env.Data))
	dec.UseNumber()
	if err := dec.Decode(&pc); err != nil {
		return Record{}, fmt.Errorf("record %s: %w", subject, err)
	}
	return Record{EventID: env.ID, Subject: subject, Data: pc, TraceParent: env.TraceParent}, nil
}

// Latest is the last record of a round: a request answered again keeps its first record (the
// duplicate window), so the last is the one of the latest request.
func Latest(recs []Record, round int) (Record, bool) {
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Data.RoundNumber == round {
			return recs[i], true
		}
	}
	return Record{}, false
}

// TraceIDs are the trace and span ids of a W3C traceparent (version-trace-span-flags).
func TraceIDs(traceparent string) (trace, span string, ok bool) {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		return "", "", false
	}
	return parts[1], parts[2], true
}
