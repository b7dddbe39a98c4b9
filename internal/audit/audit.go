// Package audit reads the PROMPTS audit stream back and checks it: the records of a team or an
// execution, the latest of a round, and the verifier that renders a record again from its own
// request, template version and evaluations_seq. The podium CLI and the console share it, so a
// record verified in the browser is verified exactly as `podium prompts verify` does.
package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
)

// Record is one prompt.composed read back from the PROMPTS audit stream.
type Record struct {
	Seq         uint64
	Stored      time.Time // when the stream stored it
	Data        events.PromptComposed
	TraceParent string // the envelope's traceparent: the composer's span that made it
}

// Records reads the prompt.composed records of a subject filter from the PROMPTS stream, oldest
// first.
func Records(ctx context.Context, js jetstream.JetStream, filter string) ([]Record, error) {
	var out []Record
	_, err := streamscan.Scan(ctx, js, events.StreamPrompts, filter, 0, func(msg jetstream.Msg) error {
		r, err := record(msg)
		if err == nil {
			out = append(out, r)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Rounds reads the latest record of each of the rounds asked, of a subject filter (one team's):
// a round with none is absent. Only those records are kept while the team's others go by, so a
// page of round 40 does not hold 40 prompts of up to 1 MiB.
func Rounds(ctx context.Context, js jetstream.JetStream, filter string, rounds ...int) (map[int]Record, error) {
	out := make(map[int]Record, len(rounds))
	_, err := streamscan.Scan(ctx, js, events.StreamPrompts, filter, 0, func(msg jetstream.Msg) error {
		r, err := record(msg)
		if err == nil && slices.Contains(rounds, r.Data.RoundNumber) {
			out[r.Data.RoundNumber] = r // later is latest, as Latest takes it
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
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
	r.Seq, r.Stored = md.Sequence.Stream, md.Timestamp
	return r, nil
}

// Decode reads one prompt.composed CloudEvent as stored on subject.
func Decode(subject string, body []byte) (Record, error) {
	var env events.Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Record{}, fmt.Errorf("record %s: %w", subject, err)
	}
	// Numbers as written, as the composer reads a request's vars: 0.50 stays 0.50.
	var pc events.PromptComposed
	dec := json.NewDecoder(bytes.NewReader(env.Data))
	dec.UseNumber()
	if err := dec.Decode(&pc); err != nil {
		return Record{}, fmt.Errorf("record %s: %w", subject, err)
	}
	return Record{Data: pc, TraceParent: env.TraceParent}, nil
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
