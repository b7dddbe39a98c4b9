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
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	cons, err := js.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	var out []Record
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, _ := msg.Metadata()
			r, err := Decode(msg.Subject(), msg.Data())
			if err != nil {
				return nil, err
			}
			r.Seq = md.Sequence.Stream
			r.Stored = md.Timestamp
			out = append(out, r)
		}
		if n == 0 {
			break
		}
		pending -= uint64(n)
	}
	return out, nil
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
