package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Batching bounds a batch and says when it is cut.
type Batching struct {
	Size  int           // messages at most
	Bytes int           // bytes of message data at most (a message larger than that is a batch alone)
	Flush time.Duration // longest a batch fills after its first message while the stage is busy
	// Linger is the gap that ends a batch when the stage is idle: messages that arrive closer
	// together join it, and a lone message goes on at once.
	Linger time.Duration
	// Overlap hands each batch to the stage in a goroutine of its own and fills the next one
	// meanwhile (the ranker: batch n+1 fills while batch n is inserted and acknowledged). While
	// the stage is busy the next batch keeps filling, up to Flush: waiting costs nothing then,
	// and larger batches cost less each. A batch filled while the stage is busy waits for it,
	// kept in progress. Without Overlap a batch is handled where it was filled.
	Overlap bool
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

// Batches is a Loop that gathers messages into batches and hands them to the stage: from a first
// message while more arrive within Linger, or, while the stage is busy, until Flush passed; at
// most Size messages or Bytes bytes. So an idle pipeline handles a message as soon as it is
// pulled, and a loaded one batches. A stop drains what the client holds in batches of what is
// already there, and the loop returns once the stage has settled every one.
//
// With Overlap the stage's goroutine outlives a lost consumer: the runtime makes the consumer
// again and runs the loop again while the stage still finishes the batch it holds (its acks may
// wait on the consumer made again), and the loop hands it the next batches as before. Close ends
// it, once every batch handed over is settled.
func Batches(b Batching, stage Stage, warn func(msg string, args ...any)) Loop {
	return &batchLoop{b: b, stage: stage, warn: warn}
}

type batchLoop struct {
	b     Batching
	stage Stage
	warn  func(msg string, args ...any)

	busy    atomic.Bool
	once    sync.Once
	batches chan []jetstream.Msg // to the overlapping stage; nil until the first Run
	handled chan struct{}        // closed once the overlapping stage has ended
	closed  sync.Once
}

// overlap starts the overlapping stage once, under work (the same for every Run).
func (l *batchLoop) overlap(work context.Context) {
	l.once.Do(func() {
		// Unbuffered: a filled batch waits in hand-over, kept in progress, until the stage
		// takes it, so filling and handling overlap by one batch and none sits unattended.
		l.batches, l.handled = make(chan []jetstream.Msg), make(chan struct{})
		go func() {
			defer close(l.handled)
			for msgs := range l.batches {
				l.busy.Store(true)
				l.stage.run(work, msgs)
				l.stage.handed(msgs, -1)
				l.busy.Store(false)
			}
		}()
	})
}

// Close ends the overlapping stage once it has settled every batch handed over.
func (l *batchLoop) Close() {
	l.closed.Do(func() {
		if l.batches != nil {
			close(l.batches)
			<-l.handled
		}
	})
}

func (l *batchLoop) Run(stop, work context.Context, it Messages) error {
	hand := func(msgs []jetstream.Msg) {
		l.stage.handed(msgs, 1)
		defer l.stage.handed(msgs, -1)
		l.stage.run(work, msgs)
	}
	if l.b.Overlap {
		l.overlap(work)
		hand = func(msgs []jetstream.Msg) {
			defer l.stage.keepAlive(msgs)()
			l.stage.handed(msgs, 1) // before the hand-over: the stage's goroutine settles it, then counts it out
			l.batches <- msgs
		}
		defer func() {
			if stop.Err() != nil {
				l.Close() // stopping: what was handed over is settled before Run returns
			}
		}()
	}
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
			l.warn("fetch failed", "error", err)
			continue
		}
		hand(fill(stop, it, first, l.b, draining, l.busy.Load))
	}
}

// fill gathers a batch after its first message. Its waits end at a stop (the batch in hand then
// goes at once), except while draining, when the stop has already come.
func fill(stop context.Context, it Messages, first jetstream.Msg, b Batching, draining bool, busy func() bool) []jetstream.Msg {
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
		busy := !draining && busy()
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
