package inputs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
)

// probes ask JetStream how far the ranker has committed, for every waiting request at once: a
// request joins the next probe, which starts after it joined, so the EVALUATIONS last sequence
// it reads covers every evaluation acknowledged before the request was handled. A burst of
// requests costs two JetStream API calls per probe instead of two per request.
type probes struct {
	js      jetstream.JetStream
	now     func() time.Time
	timeout time.Duration // of one probe's API calls
	b       *batcher[struct{}, struct{}, *probe]
	// lineage hears of the store lineage each probe read (lineage.go).
	lineage *lineage
}

func newProbes(js jetstream.JetStream, now func() time.Time, timeout time.Duration, l *lineage) *probes {
	p := &probes{js: js, now: now, timeout: timeout, lineage: l}
	// One probe at a time, of the one key: every request waiting joins it.
	p.b = newBatcher(1, 1, func(ctx context.Context, _ map[struct{}][]struct{}) (map[struct{}]*probe, error) {
		return map[struct{}]*probe{{}: p.run(ctx)}, nil
	})
	return p
}

// probe is one reading of the EVALUATIONS stream and the ranker consumer, in that order.
type probe struct {
	noStream   bool   // the stream does not exist (deleted, or not made yet)
	lastSeq    uint64 // the stream's last sequence
	stream     string // the stream's identity (chstore.StreamID)
	streamErr  error
	consumer   *jetstream.ConsumerInfo // nil when not found or on error
	consumeErr error
	// refilling says why the ranker is refilling the store from the stream (its consumer's
	// metadata, events.MetaStoreRefilling); empty when it is not.
	refilling string
	// lineage is the store lineage the ranker published (events.MetaStoreLineage; empty: none),
	// era the era of its stream (events.MetaStoreEra), eraErr a value that is not an era.
	lineage string
	era     uint32
	eraErr  error
	// anchor is the lineage's anchor row (events.MetaStoreAnchor); zero when none was published.
	anchor chstore.RowKey
}

// join waits for a probe that started after the call.
func (p *probes) join(ctx context.Context) (*probe, error) {
	pr, _, err := p.b.get(ctx, struct{}{}, struct{}{})
	return pr, err
}

func (p *probes) run(ctx context.Context) *probe {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	pr := &probe{}
	started := p.now()
	stream, err := p.js.Stream(ctx, events.StreamEvaluations)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		pr.noStream = true
		return pr
	}
	if err != nil {
		pr.streamErr = err
		return pr
	}
	info := stream.CachedInfo()
	pr.lastSeq, pr.stream = info.State.LastSeq, chstore.StreamID(info.Created)
	cons, err := stream.Consumer(ctx, events.ConsumerRanker)
	if err != nil {
		pr.consumeErr = err
		return pr
	}
	pr.consumer = cons.CachedInfo()
	md := pr.consumer.Config.Metadata
	pr.refilling, pr.lineage = md[events.MetaStoreRefilling], md[events.MetaStoreLineage]
	if s := md[events.MetaStoreEra]; s != "" {
		era, err := strconv.ParseUint(s, 10, 32)
		pr.era, pr.eraErr = uint32(era), err
	}
	if s := md[events.MetaStoreAnchor]; s != "" {
		pr.anchor, _ = chstore.ParseRowKey(s) // unreadable: reads are not anchored
	}
	p.lineage.saw(pr.lineage, pr.refilling, pr.era, pr.anchor, info.Created, started)
	return pr
}

// committed reports whether the probe shows the ranker has committed up to target, and if not,
// why, for the inputs_not_ready message.
func (p *probe) committed(target uint64) (bool, string) {
	switch {
	case p.noStream:
		return false, "EVALUATIONS stream not found"
	case p.streamErr != nil:
		return false, "EVALUATIONS stream: " + p.streamErr.Error()
	case errors.Is(p.consumeErr, jetstream.ErrConsumerNotFound):
		return false, "ranker consumer not found"
	case p.consumeErr != nil:
		return false, "ranker consumer: " + p.consumeErr.Error()
	}
	if p.refilling != "" {
		// Nothing read from the store is whole until the refill ends, whatever the ack floor says.
		return false, "the ranker is refilling ClickHouse from EVALUATIONS (" + p.refilling + ")"
	}
	ci := p.consumer
	// The ack floor stops short of the last sequence when the last messages are not the
	// ranker's to ack; then nothing pending means all are done, once the consumer has been
	// handed the target. Delivered must reach it: a message just stored may not be counted as
	// pending yet (the consumer learns of it asynchronously), and must not pass for committed.
	// A tail that is never delivered (deleted by an operator) waits for the next evaluation.
	if ci.AckFloor.Stream >= target || ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Delivered.Stream >= target {
		return true, ""
	}
	return false, fmt.Sprintf("ranker committed up to sequence %d of %d", ci.AckFloor.Stream, target)
}
