// Package consume is the one consumer runtime of the services, shaped like watermill's router:
// the runtime pulls from a durable JetStream consumer into a buffer of its own (pull.go), a loop
// gathers messages (workers.go: one at a time; batches.go: batches, filled while the last is
// handled where asked), and a stage (handler.go) hands them to the one handler shape, a batch in
// and an outcome per message out, settles each outcome and keeps every message it holds in
// progress until then. Middleware wraps handlers, which know nothing of pulling, settling or
// recovery: a panic's recovery (recover.go) and a message's span (trace.go). A pull that ends without being asked to
// (an operator deleted the consumer or its stream) is a fault: the runtime turns the service
// unready, makes the consumer (and, where the service manages streams, the stream) again with
// its configuration and goes on; if it cannot within RecoverFor, Run returns the error and the
// service exits non-zero. It is never ready while nothing is consumed.
package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/retry"
)

// Source is where a service's messages come from: its durable consumer on its stream, and how
// to make both again.
type Source struct {
	JS       jetstream.JetStream
	Stream   string
	Consumer jetstream.ConsumerConfig
	// StreamConfig is the stream's configuration when the service manages its streams
	// (MANAGE_STREAMS): a deleted stream is made again. Nil: the operator owns the stream, and
	// the runtime waits for it to exist again.
	StreamConfig *jetstream.StreamConfig
}

// ensure creates the consumer with cfg, or updates the one there. Where it starts and its
// metadata are the existing consumer's to keep: one made again after a loss starts after what was
// handled (Runtime.resumeAt), a later update with the configuration's DeliverAll would be
// refused, and the metadata is SetMetadata's alone to change.
func (s Source) ensure(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if s.StreamConfig != nil {
		if _, err := s.JS.Stream(ctx, s.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
			if err := s.remakeStream(ctx); err != nil {
				return nil, err
			}
		}
	}
	if have, err := s.JS.Consumer(ctx, s.Stream, cfg.Durable); err == nil {
		// Its metadata too is the consumer's: another replica may have published a newer state
		// there (Runtime.SetMetadata) than this one's configuration holds.
		old := have.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime, cfg.Metadata = old.DeliverPolicy, old.OptStartSeq, old.OptStartTime, old.Metadata
	}
	cons, err := s.JS.CreateOrUpdateConsumer(ctx, s.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("consume: consumer %s on %s: %w", cfg.Durable, s.Stream, err)
	}
	return cons, nil
}

// deletionSettles is how long a deleted stream is left alone before it is made again. nats-server
// (2.15) takes a deleted stream out of the account first, then stops its consumers (which ends
// our pull), and only then moves the stream's directory away: a stream made again in that window
// has its files moved away with the old ones, and then refuses updates ("meta.inf.tmp: no such
// file or directory") and leaves publishes unanswered. Seen in TestStreamDeletedIsMadeAgain
// under load, with the stream made again 2 ms after the delete.
const deletionSettles = time.Second

// remakeStream makes the deleted stream again once its deletion has settled; an operator who
// made it again meanwhile wins.
func (s Source) remakeStream(ctx context.Context) error {
	if err := retry.Sleep(ctx, deletionSettles); err != nil {
		return fmt.Errorf("consume: recreate stream %s: %w", s.Stream, err)
	}
	if _, err := s.JS.CreateStream(ctx, *s.StreamConfig); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("consume: recreate stream %s: %w", s.Stream, err)
	}
	return nil
}

// Loop consumes: Run from one iterator until it closes, when stop ends (it then drains the
// iterator and finishes what it holds, under work) or by itself, returning the last error the
// iterator gave, which says why it closed by itself; Run again on the next iterator after a lost
// consumer is made again. Close ends what a loop keeps from one Run to the next (an overlapping
// stage, Batching.Overlap) once all it was handed is settled: Runtime.Run calls it when it
// returns, however it returns.
type Loop interface {
	Run(stop, work context.Context, it Messages) error
	Close()
}

// LoopFunc is a Loop that keeps nothing between runs.
type LoopFunc func(stop, work context.Context, it Messages) error

// Run runs f.
func (f LoopFunc) Run(stop, work context.Context, it Messages) error { return f(stop, work, it) }

// Close does nothing.
func (LoopFunc) Close() {}

// Runtime runs a Loop on a Source.
type Runtime struct {
	Source Source
	Log    *slog.Logger
	// Buffer bounds what the runtime holds ahead of the loop (pull.go).
	Buffer Buffer
	// Consuming hears whether messages are being consumed (nil) or why not (the service's
	// readiness): the loop runs, and its fetches succeed.
	Consuming func(error)
	// RecoverFor is how long the runtime tries to get a lost consumer back before it gives up.
	RecoverFor time.Duration
	// Recoveries counts consumers made again after a fault (may be nil).
	Recoveries prometheus.Counter
	// Remade, where set, hears that the consumer was made again after a loss, once the runtime
	// consumes it (its stream may be another one now, which Consumes already says: the ranker
	// checks its store's lineage at once).
	Remade func()
	// Starting, where set, hears of each pass before it pulls anything (Pass already says its
	// stream), and the pass waits for it: the ranker notes its pass for its other replicas then,
	// so that no batch of a pass is in hand before the pass is known.
	Starting func(stop context.Context)
	// Panics counts messages whose handler panicked (Recover; may be nil).
	Panics prometheus.Counter

	mu       sync.Mutex        // guards metadata
	metadata map[string]string // set by SetMetadata: kept by every consumer made again

	// passes counts the passes Run started; pass is the identity of the stream the running one
	// reads (nil between passes): Consumes.
	passes atomic.Uint64
	pass   atomic.Pointer[time.Time]

	// lookups shares the consumer lookups of Delivering.
	lookups lookups

	floorMu     sync.Mutex
	floor       uint64    // the consumer's last ack floor the runtime saw
	floorStream time.Time // on the stream created then

	// beforeEnsure, when set (tests), runs in recover between the start's reckoning and the
	// consumer's creation or update: where an operator's deletion can fall.
	beforeEnsure func()
}

// Consumes reports whether the runtime hands over no batch of another stream than the one created
// at created: no pass has started yet, or the running one reads that stream. Between passes (a
// consumer lost with its stream, not yet made again on the new one) and while a pass of a stream
// before still runs, what it holds may still be handed over: false.
func (rt *Runtime) Consumes(created time.Time) bool {
	if rt.passes.Load() == 0 {
		return true
	}
	p := rt.pass.Load()
	return p != nil && p.Equal(created)
}

// Pass is the identity (creation time) of the stream the running pass reads, zero before the
// first pass and between two. Read before a count of what the passes handed over
// (Stage.InHand): a pass's batches are all counted before it ends.
func (rt *Runtime) Pass() time.Time {
	if p := rt.pass.Load(); p != nil {
		return *p
	}
	return time.Time{}
}

// Delivering reports whether the consumer that delivered msgs is the one there is now, looked up
// by name: false once it was deleted, alone or with its stream, and made again (by this runtime
// or another replica's). A settlement's subject names the stream and the consumer, not which one:
// sent now, an ack would reach the consumer made again, whose sequences may be another stream's
// (a stream made again starts over at 1), and settle a message of it that nobody handled. False
// too when the consumer cannot be looked up: a batch not settled is only delivered again, and
// every sink is idempotent. True for messages that did not come through the runtime.
//
// Asked after a fetch, it also says which stream the messages are of: a consumer that still
// exists with the creation time the pass saw is the one that served the fetch (two consumers of
// one name cannot exist at once), so its messages are of the stream the pass read (StreamOf); a
// pass that has not yet seen its consumer lost may fetch from the one made again, on the new
// stream.
//
// Only a definite answer is false: the consumer or its stream not found, or another creation
// time. A lookup that fails otherwise (the JetStream API busy, a leader moving) is tried again
// with the shared backoff for up to a third of the consumer's AckWait (the stage keeps the batch
// in progress meanwhile), then taken as false. Batches that ask at once share a lookup (lookups).
func (rt *Runtime) Delivering(ctx context.Context, msgs []jetstream.Msg) bool {
	if len(msgs) == 0 {
		return true
	}
	was := consumerOf(msgs[0])
	if was.IsZero() {
		return true
	}
	deadline := time.Now().Add(max(rt.Source.Consumer.AckWait/3, time.Second))
	for attempt := uint64(1); ; attempt++ {
		created, err := rt.lookups.created(ctx, rt.lookupConsumer)
		switch {
		case err == nil:
			return created.Equal(was)
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
			return false
		case ctx.Err() != nil || time.Now().After(deadline):
			rt.Log.Warn("the consumer that delivered a batch could not be looked up; the batch is not settled, and comes again after its ack wait", "consumer", rt.Source.Consumer.Durable, "error", err)
			return false
		}
		if retry.Sleep(ctx, retry.Redelivery().Backoff(attempt)) != nil {
			return false
		}
	}
}

// lookupConsumer looks the consumer up by name: its creation time.
func (rt *Runtime) lookupConsumer() (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := rt.Source.JS.Consumer(ctx, rt.Source.Stream, rt.Source.Consumer.Durable)
	if err != nil {
		return time.Time{}, err
	}
	return cons.CachedInfo().Created, nil
}

// lookups shares consumer lookups between the batches that ask at once (a composer's workers
// settle one request each): a caller waits for the first lookup that starts after it asked, whose
// answer is then as fresh as one of its own, so at most one lookup is in flight and one waits to
// start, whatever the number of callers.
type lookups struct {
	mu       sync.Mutex
	inFlight bool
	next     *lookup // the lookup that starts once the one in flight has answered
}

// lookup is one lookup's answer, ready once done is closed.
type lookup struct {
	done    chan struct{}
	created time.Time
	err     error
}

// created is the consumer's creation time by a lookup (look) that started after the call.
func (l *lookups) created(ctx context.Context, look func() (time.Time, error)) (time.Time, error) {
	l.mu.Lock()
	if l.next == nil {
		l.next = &lookup{done: make(chan struct{})}
	}
	mine := l.next
	if !l.inFlight {
		l.inFlight = true
		go l.run(look)
	}
	l.mu.Unlock()
	select {
	case <-mine.done:
		return mine.created, mine.err
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// run makes the waiting lookups one after another until none waits.
func (l *lookups) run(look func() (time.Time, error)) {
	for {
		l.mu.Lock()
		cur := l.next
		l.next = nil
		if cur == nil {
			l.inFlight = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		cur.created, cur.err = look()
		close(cur.done)
	}
}

// streamCreated is the identity of the stream consumed (its creation time), read again with the
// shared backoff until it is read: a message whose stream is not known cannot be told from one of
// a stream made again since (StreamOf). Zero only when ctx ends first.
func (rt *Runtime) streamCreated(ctx context.Context) time.Time {
	var created time.Time
	_ = retry.Do(ctx, retry.Redelivery(), func(try uint64, err error, pause time.Duration) {
		rt.Log.Warn("the identity of the stream consumed is not read yet; consuming waits for it", "stream", rt.Source.Stream, "attempt", try, "retry_in", pause.String(), "error", err)
	}, func(ctx context.Context, _ uint64) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := rt.Source.JS.Stream(ctx, rt.Source.Stream)
		if err != nil {
			return err
		}
		created = st.CachedInfo().Created
		return nil
	})
	return created
}

// noteFloor records the consumer's ack floor on the stream of that identity.
func (rt *Runtime) noteFloor(stream time.Time, floor uint64) {
	if stream.IsZero() {
		return
	}
	rt.floorMu.Lock()
	defer rt.floorMu.Unlock()
	rt.floor, rt.floorStream = floor, stream
}

// resumeAt is where a consumer made again starts: after the last floor seen, while the stream is
// the same one; 0 (from the start) when none was seen or the stream was made again (its sequences
// start over). A stream that cannot be looked up now is an error, not a reason to start over.
func (rt *Runtime) resumeAt(ctx context.Context) (uint64, error) {
	rt.floorMu.Lock()
	floor, stream := rt.floor, rt.floorStream
	rt.floorMu.Unlock()
	if floor == 0 {
		return 0, nil
	}
	st, err := rt.Source.JS.Stream(ctx, rt.Source.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, nil // deleted: made again, its sequences start over
	case err != nil:
		return 0, fmt.Errorf("consume: stream %s: %w", rt.Source.Stream, err)
	case !st.CachedInfo().Created.Equal(stream):
		return 0, nil
	}
	return floor + 1, nil
}

// SetMetadata updates the consumer's metadata (its state for others to read: the ranker's
// store lineage) on the server, and keeps it for every time the consumer is made again.
//
// It changes the metadata alone, of the consumer as it is: a missing consumer is the runtime's to
// make again (with this metadata), after the ack floor it saw, and is no error. Readers of a
// missing consumer's metadata find none, which they take as "not known yet"; and a caller that
// waited for the consumer would wait for ever where the runtime makes it again only once the
// loop has finished what it holds (the ranker's refill holds every commit).
func (rt *Runtime) SetMetadata(ctx context.Context, md map[string]string) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.metadata = maps.Clone(md)
	cons, err := rt.Source.JS.Consumer(ctx, rt.Source.Stream, rt.Source.Consumer.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("consume: consumer %s: %w", rt.Source.Consumer.Durable, err)
	}
	cfg := cons.CachedInfo().Config
	if maps.Equal(own(cfg.Metadata), own(md)) {
		return nil
	}
	next := maps.Clone(md)
	for k, v := range cfg.Metadata {
		if strings.HasPrefix(k, serverMetadata) {
			next[k] = v
		}
	}
	cfg.Metadata = next
	_, err = rt.Source.JS.UpdateConsumer(ctx, rt.Source.Stream, cfg)
	if brokenStore(err) {
		// The server lost the consumer's files (see recover) and refuses every update: deleted,
		// it is the runtime's to make again, with this metadata, as any lost consumer.
		rt.Log.Warn("the consumer has no store on the server; deleting it to make it again with its metadata",
			"consumer", cfg.Durable, "stream", rt.Source.Stream, "error", err)
		if derr := rt.Source.JS.DeleteConsumer(ctx, rt.Source.Stream, cfg.Durable); derr == nil || errors.Is(derr, jetstream.ErrConsumerNotFound) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("consume: metadata of consumer %s: %w", cfg.Durable, err)
	}
	return nil
}

// serverMetadata prefixes the metadata keys nats-server sets on a consumer itself.
const serverMetadata = "_nats"

// own is the metadata a service set, without the server's keys.
func own(md map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range md {
		if !strings.HasPrefix(k, serverMetadata) {
			out[k] = v
		}
	}
	return out
}

// config is the consumer's configuration with the metadata set; rt.mu held.
func (rt *Runtime) config() jetstream.ConsumerConfig {
	cfg := rt.Source.Consumer
	cfg.Metadata = maps.Clone(rt.metadata)
	return cfg
}

// ErrNotConsuming is the state of a runtime whose loop does not run.
var ErrNotConsuming = errors.New("not consuming")

// watchEvery is how often a running consumer is looked up by name. nats.go tells a pull that the
// consumer was deleted only while the pull waits on the server; a service whose buffer is full
// (a batch held behind a slow insert) has no pull waiting, and its later pulls are refused
// without the iterator closing. The lookup finds it gone whatever the pulls do.
const watchEvery = 2 * time.Second

// watch looks the consumer up every watchEvery while the loop runs and stops the iterator when
// the consumer or its stream is gone, or the consumer of that name is another one (made again by
// another replica, perhaps on a stream made again: what it delivers is not of the stream this pass
// read, StreamOf); the loop then ends as for any loss. The returned function ends the watch and
// returns the loss it saw, if any.
func watch(stop context.Context, cons jetstream.Consumer, it Messages, floor func(uint64)) func() error {
	var created time.Time
	if info := cons.CachedInfo(); info != nil {
		created = info.Created
	}
	ctx, cancel := context.WithCancel(stop)
	done := make(chan struct{})
	var cause error
	go func() {
		defer close(done)
		t := time.NewTicker(watchEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ictx, icancel := context.WithTimeout(ctx, watchEvery)
			info, err := cons.Info(ictx)
			icancel()
			if err == nil {
				floor(info.AckFloor.Stream)
			}
			if lostConsumer(err) {
				cause = fmt.Errorf("consume: consumer looked up and not found: %w", err)
				it.Stop()
				return
			}
			if err == nil && !created.IsZero() && !info.Created.Equal(created) {
				cause = fmt.Errorf("consume: the consumer was made again elsewhere (created %s, this pass's %s)", info.Created.Format(time.RFC3339Nano), created.Format(time.RFC3339Nano))
				it.Stop()
				return
			}
		}
	}()
	return func() error {
		cancel()
		<-done
		return cause
	}
}

// keepEvery is how often what the runtime holds is kept alive: a third of the consumer's AckWait.
func (rt *Runtime) keepEvery() time.Duration {
	wait := rt.Source.Consumer.AckWait
	if wait <= 0 {
		wait = 30 * time.Second // the server's default
	}
	return max(wait/3, 100*time.Millisecond)
}

// retryEvery is the pause between two tries to get a lost consumer back.
const retryEvery = 500 * time.Millisecond

// Run consumes with loop until stop ends, then returns nil once the loop has finished what it
// held; or returns an error when the consumer was lost and could not be had back.
func (rt *Runtime) Run(stop, work context.Context, cons jetstream.Consumer, loop Loop) error {
	defer loop.Close()
	remade := false
	for {
		started := time.Now()
		// Read after the consumer was made: what it delivers is of this stream (had the stream
		// been made again since, the consumer would be gone with the one before, and deliver
		// nothing).
		stream := rt.streamCreated(stop)
		rt.pass.Store(&stream)
		rt.passes.Add(1)
		if rt.Starting != nil {
			if rt.Starting(stop); stop.Err() != nil {
				rt.pass.Store(nil)
				return nil // stopped before the pass could begin: it pulls nothing
			}
		}
		if remade && rt.Remade != nil {
			rt.Remade() // consuming the stream there is now: Consumes says so from here on
		}
		remade = false
		it := newPull(cons, stream, rt.Buffer, rt.keepEvery(), rt.Log, rt.Consuming)
		rt.Consuming(nil)
		if info := cons.CachedInfo(); info != nil {
			rt.noteFloor(stream, info.AckFloor.Stream) // known from the start, not only after a lookup
		}
		lost := watch(stop, cons, it, func(floor uint64) { rt.noteFloor(stream, floor) })
		err := loop.Run(stop, work, it)
		if cause := lost(); cause != nil {
			err = cause
		}
		rt.Consuming(ErrNotConsuming)
		it.Stop()
		rt.pass.Store(nil) // what the pass held is handled: nothing of its stream comes any more
		if stop.Err() != nil {
			return nil
		}
		// Ended by itself: the consumer (or its stream) is gone. A consumer that ends as soon as it
		// is made again is not retried in a tight loop.
		lostAt := time.Now()
		rt.Log.Error("consumer lost; making it again", "consumer", rt.Source.Consumer.Durable, "stream", rt.Source.Stream, "cause", errText(err))
		if retry.Sleep(stop, retryEvery-time.Since(started)) != nil {
			return nil
		}
		if cons, err = rt.recover(stop); err != nil {
			if stop.Err() != nil {
				return nil
			}
			return err
		}
		if rt.Recoveries != nil {
			rt.Recoveries.Inc()
		}
		remade = true
		rt.Log.Warn("consumer made again; consuming", "consumer", rt.Source.Consumer.Durable, "stream", rt.Source.Stream,
			"after", time.Since(lostAt).Round(time.Millisecond).String())
	}
}

// Open creates or updates the consumer at a service's start, trying for RecoverFor as after a
// loss: a consumer deleted a moment ago may not be made again at once (nats-server answers 500
// while it still moves the deleted one's files away), and one the server lost the files of is
// deleted and made again (brokenStore), as recover does.
func (rt *Runtime) Open(ctx context.Context) (jetstream.Consumer, error) { return rt.recover(ctx) }

// recover makes the consumer again, trying for RecoverFor. It starts after the last ack floor
// the runtime saw, while the stream is the one it saw it on: a consumer made again from the
// stream's first message would hand every message handled since then to the service again, and
// the composer would answer requests again whose first answers are past PROMPTS' duplicate
// window. What lies between that floor and what was in hand when it was lost is handled again,
// seconds later, as any redelivery.
func (rt *Runtime) recover(stop context.Context) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(stop, rt.RecoverFor)
	defer cancel()
	for {
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		rt.mu.Lock()
		cfg := rt.config()
		start, err := rt.resumeAt(tctx)
		if err == nil && start == 0 && rt.learnFloor(tctx) {
			start, err = rt.resumeAt(tctx)
		}
		if start > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
		}
		var cons jetstream.Consumer
		if err == nil {
			if rt.beforeEnsure != nil {
				rt.beforeEnsure()
			}
			cons, err = rt.Source.ensure(tctx, cfg)
		}
		rt.mu.Unlock()
		tcancel()
		if err == nil {
			return cons, nil
		}
		pause := retryEvery
		if brokenStore(err) {
			// A consumer made again while nats-server still removes the deleted one's files
			// loses its own files with them, and refuses every update after ("meta.inf.tmp: no
			// such file or directory"; seen in the chaos soak: a minute of refusals, then the
			// composer exited). Deleted, it is made whole by the next try, after the removal
			// has settled.
			rt.Log.Warn("the consumer has no store on the server; deleting it to make it once more",
				"consumer", rt.Source.Consumer.Durable, "stream", rt.Source.Stream, "error", err)
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			_ = rt.Source.JS.DeleteConsumer(dctx, rt.Source.Stream, rt.Source.Consumer.Durable)
			dcancel()
			pause = deletionSettles
		} else {
			rt.Log.Warn("durable consumer not made yet; trying again", "consumer", rt.Source.Consumer.Durable, "stream", rt.Source.Stream, "error", err)
		}
		if retry.Sleep(ctx, pause) != nil {
			return nil, fmt.Errorf("consume: consumer %s on %s lost and not made again within %s: %w", rt.Source.Consumer.Durable, rt.Source.Stream, rt.RecoverFor, err)
		}
	}
}

// learnFloor notes what the consumer the server has now has handled, where the runtime saw no floor
// yet (a service starting): should the consumer be lost while it is updated (deleted under the
// update, or its files gone: brokenStore), it is made again past that, not from the stream's
// first message. True when a floor was noted.
func (rt *Runtime) learnFloor(ctx context.Context) bool {
	have, err := rt.Source.JS.Consumer(ctx, rt.Source.Stream, rt.Source.Consumer.Durable)
	if err != nil {
		return false
	}
	info := have.CachedInfo()
	floor := info.AckFloor.Stream
	if c := info.Config; c.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && c.OptStartSeq > floor+1 {
		floor = c.OptStartSeq - 1 // made again past a floor, and nothing acknowledged since
	}
	st, err := rt.Source.JS.Stream(ctx, rt.Source.Stream)
	// A consumer older than the stream is of one deleted since (the lookups raced a remake): its
	// floor says nothing of this one.
	if err != nil || floor == 0 || info.Created.Before(st.CachedInfo().Created) {
		return false
	}
	rt.noteFloor(st.CachedInfo().Created, floor)
	return true
}

// brokenStore reports whether the server refused a consumer because its files are gone.
func brokenStore(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code >= 500 && strings.Contains(api.Description, "no such file or directory")
}

func errText(err error) string {
	if err == nil {
		return "the pull ended"
	}
	return err.Error()
}

// closed reports whether an iterator error means it will deliver nothing more.
func closed(err error) bool { return errors.Is(err, jetstream.ErrMsgIteratorClosed) }

// lostConsumer reports whether an iterator error says the consumer or its stream is gone.
func lostConsumer(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound)
}
