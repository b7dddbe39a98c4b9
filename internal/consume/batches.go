package consume

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BatchFunc takes one batch of messages; it returns once it has handed the batch on (it may
// block, to hold the next batch back while the last is written).
type BatchFunc func(stop, work context.Context, msgs []jetstream.Msg)

// Batching bounds a batch.
type Batching struct {
	Size  int           // messages at most
	Bytes int           // bytes of message data at most (a message larger than that is a batch alone)
	Flush time.Duration // longest wait for a batch to fill after its first message
}

// Batches is a Loop that gathers messages into batches: from a first message until Size or
// Bytes is reached or Flush passed. A stop cuts the wait short and drains what the client holds
// in batches of what is already there.
func Batches(b Batching, h BatchFunc, warn func(msg string, args ...any)) Loop {
	return func(stop, work context.Context, it jetstream.MessagesContext) error {
		var last error
		draining := false
		for {
			var first jetstream.Msg
			var err error
			if draining {
				first, err = it.Next(jetstream.NextMaxWait(b.Flush))
			} else {
				first, err = it.Next(jetstream.NextContext(stop))
			}
			switch {
			case err == nil:
			case closed(err) || draining && errors.Is(err, nats.ErrTimeout):
				return last
			case stop.Err() != nil:
				// Stop pulling; what the server already sent is still ours to finish.
				it.Drain()
				draining = true
				continue
			case errors.Is(err, nats.ErrTimeout):
				continue
			case lostConsumer(err):
				it.Stop()
				return err
			default:
				last = err
				warn("fetch failed", "error", err)
				continue
			}
			h(stop, work, fill(stop, it, first, b, draining))
		}
	}
}

// fill gathers a batch after its first message.
func fill(stop context.Context, it jetstream.MessagesContext, first jetstream.Msg, b Batching, draining bool) []jetstream.Msg {
	batch := []jetstream.Msg{first}
	size := len(first.Data())
	ctx, cancel := context.WithTimeout(stop, b.Flush)
	defer cancel()
	for len(batch) < b.Size && size < b.Bytes {
		var msg jetstream.Msg
		var err error
		if draining {
			msg, err = it.Next(jetstream.NextMaxWait(10 * time.Millisecond))
		} else {
			msg, err = it.Next(jetstream.NextContext(ctx))
		}
		if err != nil {
			break
		}
		batch = append(batch, msg)
		size += len(msg.Data())
	}
	return batch
}
