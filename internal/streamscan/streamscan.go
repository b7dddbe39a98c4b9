// Package streamscan reads what a stream holds on a subject filter, oldest first, once: the
// audit records of the CLI and the console, and the console's catch-up of requests and answers.
// One message is in hand at a time, so what a reader keeps is its own choice, not the stream's
// size.
package streamscan

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// fetchMax is the most messages one fetch asks for, fetchBytes the most bytes (raised to the
// server's max payload, so one message always fits: a fetch whose first message is larger than
// its byte bound would get nothing).
const (
	fetchMax   = 256
	fetchBytes = 4 << 20
)

// emptyFetches is how many fetches in a row may come back empty while the stream still holds
// messages after the last one read before the scan gives up: one empty fetch is a slow server or
// an ordered consumer being reset, not the end of the stream.
const emptyFetches = 3

// inactive is how long the server keeps a scan's consumer after its last fetch when the reader
// could not delete it (it went away): scans of a console page must not pile up consumers.
const inactive = 30 * time.Second

// Scan hands fn every message of stream on filter after sequence after (0: from the first),
// oldest first, up to what the stream held when the scan began; fn's error stops it. It returns
// how many messages fn saw. A missing stream is jetstream.ErrStreamNotFound, wrapped. The scan's
// consumer is deleted when it returns.
func Scan(ctx context.Context, js jetstream.JetStream, stream, filter string, after uint64, fn func(jetstream.Msg) error) (int, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, InactiveThreshold: inactive}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", stream, err)
	}
	defer release(js, stream, cons)
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", stream, err)
	}
	maxBytes := fetchBytes
	if nc := js.Conn(); nc != nil {
		maxBytes = max(maxBytes, int(nc.MaxPayload())+64<<10)
	}
	read, last, empty := 0, after, 0
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, fetchMax)), jetstream.FetchMaxBytes(maxBytes), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return read, fmt.Errorf("read %s: %w", stream, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			if md, err := msg.Metadata(); err == nil {
				last = md.Sequence.Stream
			}
			if err := fn(msg); err != nil {
				return read + n, err
			}
		}
		// A fetch that failed part way says so here: what was read is not the whole.
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return read + n, fmt.Errorf("read %s: %w", stream, err)
		}
		read += n
		pending -= min(uint64(n), pending)
		if n > 0 {
			empty = 0
			continue
		}
		// Nothing came: the end only if the stream holds nothing on filter after the last
		// message read (the rest was deleted meanwhile: retention, an operator).
		more, err := holdsAfter(ctx, js, stream, filter, last)
		if err != nil {
			return read, fmt.Errorf("read %s: %w", stream, err)
		}
		if !more {
			break
		}
		if empty++; empty >= emptyFetches {
			return read, fmt.Errorf("read %s: %d fetches in a row returned nothing while the stream holds messages after sequence %d", stream, empty, last)
		}
		if ctx.Err() != nil {
			return read, ctx.Err()
		}
	}
	return read, nil
}

// holdsAfter reports whether the stream holds a message on filter after sequence seq.
func holdsAfter(ctx context.Context, js jetstream.JetStream, stream, filter string, seq uint64) (bool, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return false, err
	}
	_, err = st.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(filter))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	return err == nil, err
}

// release deletes the scan's consumer; when it cannot (the connection or the stream is gone),
// the server drops it after inactive.
func release(js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil || info.Name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, info.Name)
}
