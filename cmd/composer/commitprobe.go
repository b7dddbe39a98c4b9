package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// commitProbes is the commit probe: it asks JetStream how far the ranker has committed, for all waiting requests at
// once: a request joins the next probe, which starts after it joined, so the EVALUATIONS last
// sequence it reads covers every evaluation acknowledged before the request was handled. A
// burst of requests costs two JetStream API calls per probe instead of two per request.
type commitProbes struct {
	js      jetstream.JetStream
	timeout time.Duration // of one probe's API calls

	mu      sync.Mutex
	next    *probe // not started yet: joined by new callers
	running bool
}

// probe is one reading of the EVALUATIONS stream and the ranker consumer, in that order.
type probe struct {
	done chan struct{}

	noStream   bool   // no evaluation was ever accepted (lastSeq is 0)
	lastSeq    uint64 // the stream's last sequence
	streamErr  error
	consumer   *jetstream.ConsumerInfo // nil when not found or on error
	consumeErr error
}

// join waits for a probe that started after the call.
func (c *commitProbes) join(ctx context.Context) (*probe, error) {
	c.mu.Lock()
	if c.next == nil {
		c.next = &probe{done: make(chan struct{})}
	}
	p := c.next
	if !c.running {
		c.running = true
		go c.loop()
	}
	c.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.done:
		return p, nil
	}
}

func (c *commitProbes) loop() {
	for {
		c.mu.Lock()
		p := c.next
		if p == nil {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.next = nil
		c.mu.Unlock()
		c.run(p)
		close(p.done)
	}
}

func (c *commitProbes) run(p *probe) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	stream, err := c.js.Stream(ctx, events.StreamEvaluations)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		p.noStream = true
		return
	}
	if err != nil {
		p.streamErr = err
		return
	}
	p.lastSeq = stream.CachedInfo().State.LastSeq
	cons, err := stream.Consumer(ctx, events.ConsumerRanker)
	if err != nil {
		p.consumeErr = err
		return
	}
	p.consumer = cons.CachedInfo()
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
