package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/retry"
)

// Messages is what a Loop takes messages from: the runtime's own pull buffer.
type Messages interface {
	// Next returns the next message in hand; ctx's error when ctx ends first; the loss when the
	// consumer is gone; jetstream.ErrMsgIteratorClosed once stopped, or drained and empty.
	Next(ctx context.Context) (jetstream.Msg, error)
	// Stop ends it at once: what it holds is left to be delivered again.
	Stop()
	// Drain asks for nothing more; Next still returns what is in hand, then ErrMsgIteratorClosed.
	Drain()
}

// Buffer bounds what the runtime holds before the loop takes it.
type Buffer struct {
	Messages int // at most (at least 1)
	Bytes    int // of message data at most; 0: no bound
}

// The runtime pulls with its own fetches into a buffer of its own rather than nats.go's
// Messages iterator, whose buffer is out of reach: messages waiting there behind a batch held by
// a slow stage (ClickHouse frozen, PROMPTS full) could not be kept alive, and the server
// delivered them again every AckWait, counting toward MaxDeliver. Every message this buffer holds
// is told InProgress every keepEvery; one a fetch brings is in the buffer as soon as it arrives.
// A fetch asks only for the room the buffer has, so the buffer is bounded by count and bytes as
// the iterator's was.

// streamMsg is a message with the identity of the stream it was consumed from, and of the
// consumer that delivered it (its creation time; zero when unknown).
type streamMsg struct {
	jetstream.Msg
	stream, consumer time.Time
}

// StreamOf is the identity (the creation time) of the stream msg was consumed from: the stream
// the runtime read when it began to consume with the consumer that delivered msg. A stream deleted
// and made again under the same name has another, and its sequences start over: a service that
// keeps sequences (the ranker) tells the streams apart by it. Zero when the runtime could not read
// it, or msg did not come through the runtime.
func StreamOf(msg jetstream.Msg) time.Time {
	if m, ok := msg.(streamMsg); ok {
		return m.stream
	}
	return time.Time{}
}

// consumerOf is the creation time of the consumer that delivered msg; zero when not known (msg
// did not come through the runtime).
func consumerOf(msg jetstream.Msg) time.Time {
	if m, ok := msg.(streamMsg); ok {
		return m.consumer
	}
	return time.Time{}
}

// fetchWait is how long one fetch waits on the server for messages; an idle consumer asks again
// after it. A fetch lost with a connection ends by then too, and a drain waits for the fetch in
// flight to end (what the server sent for it is the service's to finish): a second bounds both.
const fetchWait = time.Second

// pull is the runtime's pull buffer over one consumer (see above).
type pull struct {
	cons      jetstream.Consumer
	stream    time.Time // the identity of the stream cons reads (StreamOf)
	created   time.Time // cons's creation time (consumerOf)
	buf       Buffer
	keepEvery time.Duration
	log       *slog.Logger

	ctx    context.Context // ends at Stop: the fetch in flight is abandoned
	cancel context.CancelFunc
	// consuming hears of fetches that fail other than for a lost consumer (permissions revoked,
	// JetStream away, a stream without quorum: nothing is consumed, though nothing is lost), and
	// of the first that succeeds again (nil).
	consuming func(error)

	mu       sync.Mutex
	queue    []jetstream.Msg
	bytes    int
	done     bool          // nothing more will be fetched
	draining bool          // Drain: no fetch after the one in flight
	stopped  bool          // Stop: Next returns closed at once
	err      error         // the loss that ended the fetches, if one did
	changed  chan struct{} // closed, and made again, at every change
}

// newPull starts fetching from cons into a buffer bounded by buf; keepEvery is how often what it
// holds is kept alive (a third of the consumer's AckWait).
func newPull(cons jetstream.Consumer, stream time.Time, buf Buffer, keepEvery time.Duration, log *slog.Logger, consuming func(error)) *pull {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pull{cons: cons, stream: stream, buf: buf, keepEvery: keepEvery, log: log, ctx: ctx, cancel: cancel, consuming: consuming,
		changed: make(chan struct{})}
	p.buf.Messages = max(p.buf.Messages, 1)
	if info := cons.CachedInfo(); info != nil {
		p.created = info.Created
	}
	go p.fetch()
	go p.keepAlive()
	return p
}

// signal wakes whoever waits on a change; p.mu held.
func (p *pull) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *pull) Next(ctx context.Context) (jetstream.Msg, error) {
	for {
		p.mu.Lock()
		switch {
		case p.stopped:
			p.mu.Unlock()
			return nil, jetstream.ErrMsgIteratorClosed
		case len(p.queue) > 0:
			msg := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			p.bytes -= len(msg.Data())
			p.signal() // room for the next fetch
			p.mu.Unlock()
			return streamMsg{Msg: msg, stream: p.stream, consumer: p.created}, nil
		case p.done:
			err := p.err
			p.mu.Unlock()
			if err == nil {
				err = jetstream.ErrMsgIteratorClosed
			}
			return nil, err
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

func (p *pull) Stop() {
	p.cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	p.signal()
}

// Drain starts no fetch after the one in flight, which ends by itself within fetchWait: the
// messages the server sent for it are still taken into the buffer, and handled. Cancelling it
// would drop those still in the client's hands, to be delivered again only after AckWait (a
// ranker stopped while filling a batch committed part of it).
func (p *pull) Drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draining = true
	p.signal()
}

// room waits until the buffer has room for a fetch and returns how much: messages, and bytes
// (0 when unbounded); false once fetching is to end. A fetch that brought nothing while the
// buffer holds messages (after) waits for the loop to take one: the next message may not fit the
// bytes left.
func (p *pull) room(after bool) (int, int, bool) {
	for {
		p.mu.Lock()
		n, b := p.buf.Messages-len(p.queue), p.buf.Bytes-p.bytes
		fits := n > 0 && (p.buf.Bytes == 0 || b > 0) && !(after && len(p.queue) > 0)
		ch, draining := p.changed, p.draining
		p.mu.Unlock()
		if p.ctx.Err() != nil || draining {
			return 0, 0, false
		}
		if fits {
			if p.buf.Bytes == 0 {
				b = 0
			}
			return n, b, true
		}
		select {
		case <-p.ctx.Done():
			return 0, 0, false
		case <-ch:
			after = false
		}
	}
}

// fetch fills the buffer until Stop or Drain, or the consumer is lost.
func (p *pull) fetch() {
	var lost error
	defer func() {
		p.mu.Lock()
		p.done, p.err = true, lost
		p.signal()
		p.mu.Unlock()
	}()
	empty, failing := false, false
	for {
		n, b, ok := p.room(empty)
		if !ok {
			return
		}
		began := time.Now()
		got, err := p.fetchOnce(n, b)
		if got == 0 && err == nil && time.Since(began) < fetchWait/2 && p.held() == 0 {
			// Ended early with nothing and nothing held: the server refused it at once (a
			// message larger than the bytes asked for); room would allow the same fetch at
			// once. Not asked again in a tight loop.
			err = errEmptyAtOnce
		}
		switch {
		case p.ctx.Err() != nil:
			return
		case errors.Is(err, errEmptyAtOnce):
			if retry.Sleep(p.ctx, retryEvery) != nil {
				return
			}
		case lostConsumer(err):
			lost = err
			return
		case err != nil:
			p.log.Warn("fetch failed", "error", err)
			failing = true
			p.consuming(fmt.Errorf("fetches from the consumer fail: %w", err))
			if retry.Sleep(p.ctx, retryEvery) != nil {
				return
			}
		case failing:
			failing = false
			p.log.Info("fetches from the consumer succeed again")
			p.consuming(nil)
		}
		empty = got == 0
	}
}

// held is how many messages the buffer holds.
func (p *pull) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// errEmptyAtOnce is a fetch that came back empty long before its wait ended.
var errEmptyAtOnce = errors.New("consume: a fetch ended at once with nothing")

// fetchOnce is one fetch of at most n messages and b bytes (0: unbounded) into the buffer; it
// returns how many it brought.
func (p *pull) fetchOnce(n, b int) (int, error) {
	ctx, cancel := context.WithTimeout(p.ctx, fetchWait)
	defer cancel()
	opts := []jetstream.FetchOpt{jetstream.FetchContext(ctx)}
	if b > 0 {
		opts = append(opts, jetstream.FetchMaxBytes(b))
	}
	batch, err := p.cons.Fetch(n, opts...)
	if err != nil {
		return 0, err
	}
	got := 0
	for msg := range batch.Messages() {
		got++
		p.mu.Lock()
		p.queue = append(p.queue, msg)
		p.bytes += len(msg.Data())
		p.signal()
		p.mu.Unlock()
	}
	err = batch.Error()
	if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) {
		err = nil // the fetch's wait ended: ask again
	}
	return got, err
}

// keepAlive tells the server every keepEvery that what the buffer holds is still in hand, until
// it is stopped, or drained and empty. InProgress is fire-and-forget: a message the loop has
// settled meanwhile ignores it.
func (p *pull) keepAlive() {
	t := time.NewTicker(p.keepEvery)
	defer t.Stop()
	for range t.C {
		p.mu.Lock()
		held := append([]jetstream.Msg(nil), p.queue...)
		over := p.stopped || p.done && len(p.queue) == 0
		p.mu.Unlock()
		if over {
			return
		}
		for _, msg := range held {
			_ = msg.InProgress()
		}
	}
}
