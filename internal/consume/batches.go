package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/settle"
)

// BatchFunc takes one batch of messages; it returns once it has handed the batch on (it may
// block, to hold the next batch back while the last is written).
type BatchFunc func(stop, work context.Context, msgs []jetstream.Msg)

// Batching bounds a batch and says when it is cut.
type Batching struct {
	Size  int           // messages at most
	Bytes int           // bytes of message data at most (a message larger than that is a batch alone)
	Flush time.Duration // longest a batch fills after its first message while Busy
	// Linger is the gap that ends a batch when the next stage is idle: messages that arrive
	// closer together join it, and a lone message goes on at once.
	Linger time.Duration
	// Busy reports whether the stage the batch goes to is still working on the one before (nil:
	// never). While it is, the batch keeps filling, up to Flush: waiting costs nothing then, and
	// larger batches cost less each.
	Busy func() bool
}

// Validate checks a batching read from the environment: prefix names the service's variables
// (RANKER: RANKER_BATCH_SIZE...), maxEventBytes is MAX_EVENT_BYTES, which one batch must hold.
func (b Batching) Validate(prefix string, maxEventBytes int) error {
	var errs []error
	if b.Size < 1 || b.Size > 100000 {
		errs = append(errs, fmt.Errorf("%s_BATCH_SIZE must be 1 to 100000, got %d", prefix, b.Size))
	}
	if minBytes := maxEventBytes + 64<<10; b.Bytes < minBytes {
		errs = append(errs, fmt.Errorf("%s_BATCH_BYTES must hold the largest event with its headers (MAX_EVENT_BYTES + 64 KiB = %d), got %d", prefix, minBytes, b.Bytes))
	}
	if b.Flush <= 0 {
		errs = append(errs, fmt.Errorf("%s_FLUSH_INTERVAL must be positive, got %s", prefix, b.Flush))
	}
	if b.Linger <= 0 || b.Linger > b.Flush {
		errs = append(errs, fmt.Errorf("%s_LINGER must be positive and at most %s_FLUSH_INTERVAL, got %s", prefix, prefix, b.Linger))
	}
	return errors.Join(errs...)
}

// KeepAliveBatches tells the broker every interval that a batch's messages are still in hand
// while h runs, so a batch waiting behind a slow stage (a dead letter with backoff, an insert
// waiting for ClickHouse) is not redelivered to another replica.
func KeepAliveBatches(every time.Duration, h BatchFunc) BatchFunc {
	return func(stop, work context.Context, msgs []jetstream.Msg) {
		defer settle.KeepAlive(every, msgs...)()
		h(stop, work, msgs)
	}
}

// Batches is a Loop that gathers messages into batches: from a first message while more arrive
// within Linger, or, while the next stage is busy, until Flush passed; at most Size messages or
// Bytes bytes. So an idle pipeline commits an evaluation as soon as it is pulled, and a loaded one
// batches. A stop drains what the client holds in batches of what is already there.
func Batches(b Batching, h BatchFunc, warn func(msg string, args ...any)) Loop {
	return func(stop, work context.Context, it Messages) error {
		draining := false
		for {
			next := stop
			if draining {
				next = context.Background() // Drain closes it once empty
			}
			first, err := it.Next(next)
			switch {
			case err == nil:
			case closed(err):
				return nil
			case stop.Err() != nil && !draining:
				// Stop pulling; what the server already sent is still ours to finish.
				it.Drain()
				draining = true
				continue
			case lostConsumer(err):
				it.Stop()
				return err
			default:
				warn("fetch failed", "error", err)
				continue
			}
			h(stop, work, fill(stop, it, first, b, draining))
		}
	}
}

// fill gathers a batch after its first message. Its waits end at a stop (the batch in hand then
// goes at once), except while draining, when the stop has already come.
func fill(stop context.Context, it Messages, first jetstream.Msg, b Batching, draining bool) []jetstream.Msg {
	batch := []jetstream.Msg{first}
	size := len(first.Data())
	deadline := time.Now().Add(b.Flush)
	linger := max(b.Linger, time.Millisecond)
	parent := stop
	if draining {
		parent = context.Background()
	}
	// Flush bounds a batch's filling whatever the mode: a steady trickle just inside Linger
	// would otherwise hold the first message until the batch is full.
	for len(batch) < b.Size && size < b.Bytes && parent.Err() == nil && time.Now().Before(deadline) {
		busy := !draining && b.Busy != nil && b.Busy()
		wait := min(linger, time.Until(deadline))
		if busy {
			// Short waits, so that the batch goes as soon as the stage is free.
			wait = min(time.Until(deadline), 5*time.Millisecond)
		}
		if wait <= 0 {
			break
		}
		ctx, cancel := context.WithTimeout(parent, wait)
		msg, err := it.Next(ctx)
		cancel()
		if err != nil {
			if parent.Err() == nil && errors.Is(err, context.DeadlineExceeded) && busy && time.Now().Before(deadline) {
				continue
			}
			break
		}
		batch = append(batch, msg)
		size += len(msg.Data())
	}
	return batch
}
