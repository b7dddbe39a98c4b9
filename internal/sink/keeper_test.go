package sink

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// keeperFixture is a keeper of a real evaluations table beside a real EVALUATIONS, its lineage
// noted and published whole on that stream (epoch 1, era 0).
type keeperFixture struct {
	k      *Keeper[rank.Record]
	nc     *nats.Conn
	st     *chstore.Store
	chCfg  chstore.Config
	kcfg   Config[rank.Record]
	js     jetstream.JetStream
	cfg    jetstream.StreamConfig
	stream jetstream.Stream
	was    chstore.Lineage
}

func newKeeperFixture(t *testing.T, tune func(*Config[rank.Record])) *keeperFixture {
	t.Helper()
	ctx := t.Context()
	st, chCfg := testenv.Store(t, true)
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	cfg, err := events.StreamConfig(events.StreamEvaluations, events.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "errors"}, []string{"kind"})
	c := Config[rank.Record]{JS: js, Table: st, Log: log,
		Rows: Rows[rank.Record]{Filter: events.TypeEvaluationCompleted + ".>",
			Of: func(msg jetstream.Msg, at Origin) (rank.Record, error) {
				md, err := msg.Metadata()
				if err != nil {
					return rank.Record{}, err
				}
				ev, err := events.ParseEvaluation(msg.Subject(), msg.Data(), 1<<20)
				return rank.RecordOf(ev, md.Sequence.Stream, at.Era), err
			},
			Key: chstore.KeyOf},
		Write: func(ctx context.Context, recs []rank.Record) (map[int]error, error) { return nil, st.Insert(ctx, recs) },
		View: &View{What: "the store", Stream: events.StreamEvaluations, Log: log,
			Whole:   health.New(prometheus.NewRegistry(), "test").Condition("store", nil),
			Metrics: ViewMetrics{Refills: prometheus.NewCounter(prometheus.CounterOpts{Name: "refills"}), Errors: errs}}}
	if tune != nil {
		tune(&c)
	}
	f := &keeperFixture{k: NewKeeper(c), nc: nc, st: st, chCfg: chCfg, kcfg: c, js: js, cfg: cfg, stream: stream,
		was: chstore.Lineage{Epoch: 1, Stream: chstore.StreamID(stream.CachedInfo().Created), Whole: true}}
	if err := st.NoteLineage(ctx, f.was); err != nil {
		t.Fatal(err)
	}
	if err := f.k.Publish(ctx, f.was, ""); err != nil {
		t.Fatal(err)
	}
	return f
}

// exec runs q on the fixture's database, as an operator would.
func (f *keeperFixture) exec(t *testing.T, q string) {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: f.chCfg.Addrs, Auth: clickhouse.Auth{Database: f.chCfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// remake deletes EVALUATIONS and makes it again: another stream, its sequences starting over.
func (f *keeperFixture) remake(t *testing.T) jetstream.Stream {
	t.Helper()
	if err := f.js.DeleteStream(t.Context(), events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	st, err := f.js.CreateStream(t.Context(), f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestACheckNeverRepublishesAnOlderLineage forces the interleaving of the race: a check that found
// the table as published (asPublished) and, before it republished that lineage, a refill that
// published a newer one. Before, the check then republished the older lineage over the newer one
// (composers and snapshots went by a lineage the store no longer had); now it sees the lineage
// moved and leaves it, and the check is made again with commits held.
func TestACheckNeverRepublishesAnOlderLineage(t *testing.T) {
	ctx := t.Context()
	var f *keeperFixture
	newer := chstore.Lineage{Epoch: 2}
	f = newKeeperFixture(t, func(c *Config[rank.Record]) {
		c.BeforeRepublish = func() {
			if err := f.k.Publish(ctx, newer, ""); err != nil { // a refill, finished meanwhile
				t.Error(err)
			}
		}
	})
	newer.Stream, newer.Whole = f.was.Stream, true
	if f.k.asPublished(ctx) {
		t.Error("the check found the table as published although the lineage moved under it")
	}
	if got := f.k.Published(); got.Epoch != newer.Epoch {
		t.Fatalf("the published lineage is epoch %d after the check; want the newer one, %d", got.Epoch, newer.Epoch)
	}
}

// TestTheEraWaitsForTheBatchesOfTheStreamBefore forces the interleaving of the race: the stream
// deleted and made again while the runtime's pass of the stream before still runs (a batch of it
// in hand, waiting for the check to let commits go). Before, the check noted and published the
// new era at once: a request composed as of it lacked that batch, which then committed in the era
// before, and the record no longer verified. Now the check puts the era off (readers wait: the
// published lineage still names the stream before) until the runtime consumes the new stream.
func TestTheEraWaitsForTheBatchesOfTheStreamBefore(t *testing.T) {
	ctx := t.Context()
	var consumed time.Time
	f := newKeeperFixture(t, func(c *Config[rank.Record]) {
		c.Consumes = func(created time.Time) bool { return created.Equal(consumed) }
	})
	consumed = f.stream.CachedInfo().Created // the pass of the stream before still runs
	now := f.remake(t)
	if err := f.k.CheckLocked(ctx); !errors.Is(err, ErrBeforeInHand) {
		t.Fatalf("the check while a batch of the stream before may come: %v, want ErrBeforeInHand", err)
	}
	if got := f.k.Published(); got.Stream != f.was.Stream || got.Era != 0 {
		t.Fatalf("the new era was published while a batch of the stream before may come: %+v", got)
	}
	consumed = now.CachedInfo().Created // the runtime consumes the new stream
	if err := f.k.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	// The table held no row of the stream before (no anchor): nothing of an older era to keep.
	if got := f.k.Published(); got.Stream != chstore.StreamID(now.CachedInfo().Created) || got.Era != 1 || got.Floor != 1 {
		t.Fatalf("once the runtime consumes the new stream: %+v, want its lineage in era 1, floor 1", got)
	}
}

// TestTheEraWaitsForABatchWaitingToCommit: the runtime consumes the new stream already, but a
// batch handed over by the pass before is waiting for the lock the check holds (a runtime's
// overlap hands a batch over before its pass ends): the switch waits for it too.
func TestTheEraWaitsForABatchWaitingToCommit(t *testing.T) {
	ctx := t.Context()
	f := newKeeperFixture(t, nil) // the runtime consumes the new stream (Consumes nil)
	f.remake(t)
	committed := make(chan struct{})
	f.k.Serial(func() { // the check holds the lock, as Check does
		go f.k.Serial(func() { close(committed) }) // a batch of the pass before, waiting for it
		testenv.WaitFor(t, 10*time.Second, "the batch waiting for the lock", func() (bool, string) {
			return f.k.waiting.Load() == 1, ""
		})
		if err := f.k.CheckLocked(ctx); !errors.Is(err, ErrBeforeInHand) {
			t.Errorf("the check while a batch waits to commit: %v, want ErrBeforeInHand", err)
		}
	})
	<-committed
	var err error
	f.k.Serial(func() { err = f.k.CheckLocked(ctx) })
	if err != nil {
		t.Fatal(err)
	}
	if got := f.k.Published(); got.Era != 1 {
		t.Fatalf("after the batch committed: era %d, want 1", got.Era)
	}
}

// TestAnAdoptedTableKeepsTheEraItsConsumerNames: the table's lineage is lost (store_lineage
// emptied) while its rows survive, and the service starts again: nothing of the lineage is left but
// what its consumer carries (era 3, floor 2), and the rows, of era 1. The table is adopted in era 3,
// the consumer's, not the rows' (a later era's rows would otherwise sort after new ones), its
// floor the oldest era it holds.
func TestAnAdoptedTableKeepsTheEraItsConsumerNames(t *testing.T) {
	ctx := t.Context()
	f := newKeeperFixture(t, func(c *Config[rank.Record]) { c.Keys, c.Consumer = StoreKeys, "keeper-test" })
	md, err := StoreKeys.Metadata(State{Lineage: chstore.Lineage{Epoch: 1, Stream: f.was.Stream, Era: 3, Floor: 2, Whole: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.CreateOrUpdateConsumer(ctx, events.StreamEvaluations, jetstream.ConsumerConfig{Durable: "keeper-test", Metadata: md}); err != nil {
		t.Fatal(err)
	}
	recs := []rank.Record{{EventID: "e1", Seq: 1, Era: 1}, {EventID: "e2", Seq: 2, Era: 1}}
	for i := range recs {
		recs[i].ExecutionID, recs[i].TeamID, recs[i].TeamName, recs[i].RoundNumber = "x", "t", "T", i+1
	}
	if err := f.st.Insert(ctx, recs); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "TRUNCATE TABLE store_lineage")
	k := NewKeeper(f.kcfg) // started again: it published nothing yet
	if err := k.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	lin, found, err := f.st.Lineage(ctx)
	if err != nil || !found || lin.Era != 3 || lin.Floor != 1 || lin.Stream != f.was.Stream || lin.Anchor != chstore.KeyOf(recs[1]) {
		t.Fatalf("the adopted lineage: %+v (%v, %v); want era 3 (the consumer's), floor 1 (the rows'), anchored on e2", lin, found, err)
	}
	if got := k.Published(); got == nil || got.ID() != lin.ID() {
		t.Fatalf("published %+v, want the adopted lineage", got)
	}
}

// TestARefillOntoAStreamMadeAgainWaitsForTheBatchesBefore: the table held nothing yet (its lineage
// has no anchor), the stream is deleted and made again, and the table is dropped while a batch of
// the stream before waits for the lock the check holds. The refill begins the new stream's era, so
// it is put off as a check's switch is (before, it began the era at once, and the batch committed
// after it in the era before); once the batch committed, the table is refilled in era 1.
func TestARefillOntoAStreamMadeAgainWaitsForTheBatchesBefore(t *testing.T) {
	ctx := t.Context()
	f := newKeeperFixture(t, func(c *Config[rank.Record]) {
		c.Grace = time.Millisecond
		c.Repair = func(ctx context.Context) error { return nil } // the test makes the table again itself
	})
	f.remake(t)
	f.exec(t, "DROP TABLE evaluations")
	repaired := false
	f.k.cfg.Repair = func(ctx context.Context) error {
		repaired = true
		_, err := f.st.Repair(ctx)
		return err
	}
	committed := make(chan struct{})
	f.k.Serial(func() {
		go f.k.Serial(func() { close(committed) }) // a batch of the stream before, waiting
		testenv.WaitFor(t, 10*time.Second, "the batch waiting for the lock", func() (bool, string) {
			return f.k.waiting.Load() == 1, ""
		})
		if err := f.k.RefillLost(ctx); !errors.Is(err, ErrBeforeInHand) {
			t.Errorf("the refill while a batch of the stream before waits: %v, want ErrBeforeInHand", err)
		}
	})
	<-committed
	if repaired {
		t.Fatal("the table was made again and refilled while a batch of the stream before waited")
	}
	if got := f.k.Published(); got.Stream != f.was.Stream || got.Era != 0 {
		t.Fatalf("published %+v while the refill was put off, want the lineage before", got)
	}
	var refilled error
	f.k.Serial(func() { refilled = f.k.RefillLost(ctx) })
	if refilled != nil {
		t.Fatal(refilled)
	}
	// The table held no row of the stream before: the refilled one holds its own era's rows alone.
	if got := f.k.Published(); !repaired || got.Stream == f.was.Stream || got.Era != 1 || got.Floor != 1 || !got.Whole {
		t.Fatalf("after the batch committed: repaired %v, published %+v; want the new stream's lineage in era 1, floor 1, whole", repaired, got)
	}
}

// TestTheEraWaitsForABatchHandedOverNotYetWaiting: the runtime consumes the new stream, and a batch
// of the pass before was handed over to the stage (a runtime's overlap hands it over before its
// pass ends) but has not reached the lock yet: nothing waits for the lock, and before, the check
// began the new era then; the batch committed after it in the era before. Now a batch in hand
// (InHand) holds the switch until it is settled; one of the new stream never does.
func TestTheEraWaitsForABatchHandedOverNotYetWaiting(t *testing.T) {
	ctx := t.Context()
	f := newKeeperFixture(t, nil) // the runtime consumes the new stream (Consumes nil)
	now := f.remake(t)
	before, after := f.stream.CachedInfo().Created, now.CachedInfo().Created
	f.k.InHand(before, 1) // handed over, not yet at the lock
	f.k.InHand(after, 1)  // one of the new stream too
	if err := f.k.CheckLocked(ctx); !errors.Is(err, ErrBeforeInHand) {
		t.Fatalf("the check while a batch of the stream before is in hand: %v, want ErrBeforeInHand", err)
	}
	if got := f.k.Published(); got.Era != 0 {
		t.Fatalf("the new era was published while a batch of the stream before was in hand: %+v", got)
	}
	f.k.InHand(before, -1) // settled
	if err := f.k.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.k.Published(); got.Era != 1 {
		t.Fatalf("once the batch of the stream before was settled: era %d, want 1", got.Era)
	}
}

// TestAnArchiveOfEarlierStreamsIsAdoptedInALaterEra: an archive written before eras were counted
// (every row era 0, no lineage) holds records of a PROMPTS deleted since beside those of the one
// there is now, whose newest row is of the stream there is now. Before, it was adopted in era 0,
// floor 0, as if the stream held everything it held: a later loss of the table was refilled as
// whole. Now the rows that name another stream put the stream there is now in era 1, floor 0.
func TestAnArchiveOfEarlierStreamsIsAdoptedInALaterEra(t *testing.T) {
	ctx := t.Context()
	st, _ := testenv.Store(t, true)
	_, js := testenv.JetStream(t, testenv.NATS(t))
	cfg, err := events.StreamConfig(events.StreamPrompts, events.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := chstore.StreamID(stream.CachedInfo().Created)
	rows := []chstore.ArchivedPrompt{
		{EventID: "old-1", EventType: events.TypePromptComposed, ExecutionID: "x", TeamID: "t", Round: 1, StreamCreated: "deleted before " + now, Seq: 1},
	}
	for i, id := range []string{"now-1", "now-2"} {
		if _, err := js.Publish(ctx, events.PromptComposedSubject("x", "t"), []byte(`{"id":"`+id+`"}`)); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, chstore.ArchivedPrompt{EventID: id, EventType: events.TypePromptComposed, ExecutionID: "x", TeamID: "t", Round: i + 2, StreamCreated: now, Seq: uint64(i + 1)})
	}
	if err := st.ArchivePrompts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	k := NewKeeper(Config[chstore.ArchivedPrompt]{JS: js, Table: st.ArchiveLineages(), Log: log,
		View: &View{What: "the prompts archive", Stream: events.StreamPrompts, Log: log,
			Whole: health.New(prometheus.NewRegistry(), "test").Condition("archive", nil)}})
	if err := k.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	lin, found, err := st.ArchiveLineages().Lineage(ctx)
	if err != nil || !found || lin.Stream != now || lin.Era != 1 || lin.Floor != 0 {
		t.Fatalf("the adopted archive: %+v (%v, %v); want the stream there is now in era 1, floor 0", lin, found, err)
	}
	if from, to, lost := lin.LostEras(now); !lost || from != 0 || to != 0 {
		t.Errorf("losing the table would lose eras %d-%d (%v), want era 0", from, to, lost)
	}
}

// auditLosses names a lost table's eras, and reads an operator's acceptance on AUDIT, as the
// services do (with no executions named).
type auditLosses struct{ nc *nats.Conn }

func (auditLosses) Of(_ context.Context, lin chstore.Lineage, stream string) (*events.StoreLoss, error) {
	from, to, lost := lin.LostEras(stream)
	if !lost {
		return nil, nil
	}
	return &events.StoreLoss{Lineage: lin.ID(), FromEra: from, ToEra: to, Executions: []string{}}, nil
}

func (l auditLosses) Accepted(ctx context.Context, lineage string) (bool, error) {
	return AcceptedOn(ctx, l.nc, events.SubjectLossAccepted, lineage)
}

func (auditLosses) Text(s events.StoreLoss) string { return "rows lost: " + ErasText(s) }

// TestALossIsResolvedOnEveryReplica: two replicas keep one table. The stream is deleted and made
// again (era 1), then the table is emptied: the rows of era 0 are kept nowhere else. Both name the
// loss, unready, refilling nothing. An operator accepts it on AUDIT; one replica refills, and the
// other, still waiting on the loss, finds the table whole at its next check: ready again, the loss
// no longer published, without a refill of its own.
func TestALossIsResolvedOnEveryReplica(t *testing.T) {
	ctx := t.Context()
	f := newKeeperFixture(t, func(c *Config[rank.Record]) { c.Grace = time.Millisecond })
	f.kcfg.Losses = auditLosses{nc: f.nc}
	if _, err := events.MakeStreams(ctx, f.js, events.StreamOptions{}, events.StreamAudit); err != nil {
		t.Fatal(err)
	}
	recs := []rank.Record{{EventID: "e1", Seq: 1}}
	recs[0].ExecutionID, recs[0].TeamID, recs[0].TeamName, recs[0].RoundNumber = "x", "t", "T", 1
	if err := f.st.Insert(ctx, recs); err != nil {
		t.Fatal(err)
	}
	anchored := f.was
	anchored.Anchor = chstore.KeyOf(recs[0])
	if err := f.st.NoteLineage(ctx, anchored); err != nil {
		t.Fatal(err)
	}
	replica := func() *Keeper[rank.Record] { // its own process: its own readiness
		c := f.kcfg
		v := *c.View
		v.Whole = health.New(prometheus.NewRegistry(), "test").Condition("store", nil)
		c.View = &v
		return NewKeeper(c)
	}
	a, b := replica(), replica()
	for _, k := range []*Keeper[rank.Record]{a, b} {
		if err := k.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.remake(t)
	for _, k := range []*Keeper[rank.Record]{a, b} {
		if err := k.Check(ctx); err != nil { // the new stream's era: its rows of era 0 stay
			t.Fatal(err)
		}
	}
	if got := a.Published(); got.Era != 1 || got.Floor != 0 {
		t.Fatalf("after the stream was made again: %+v, want era 1, floor 0", got)
	}
	f.exec(t, "TRUNCATE TABLE evaluations")
	for name, k := range map[string]*Keeper[rank.Record]{"a": a, "b": b} {
		if err := k.Check(ctx); !errors.Is(err, ErrLossHeld) {
			t.Fatalf("replica %s after the table was emptied: %v, want ErrLossHeld", name, err)
		}
		if k.Loss() == nil || k.Loss().FromEra != 0 || k.Loss().ToEra != 0 {
			t.Fatalf("replica %s names the loss %+v, want era 0", name, k.Loss())
		}
	}
	body, err := json.Marshal(events.StoreLoss{Lineage: a.Loss().Lineage, FromEra: 0, ToEra: 0, Executions: []string{}, Reason: "no backup"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(ctx, events.SubjectLossAccepted, body); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); err != nil { // accepted: refilled from the stream there is now
		t.Fatal(err)
	}
	if err := a.Check(ctx); err != nil { // whole, by the other replica's refill
		t.Fatal(err)
	}
	if a.Loss() != nil || a.cfg.View.Whole.Err() != nil {
		t.Errorf("the replica that did not refill still waits on the loss %+v (%v)", a.Loss(), a.cfg.View.Whole.Err())
	}
	if got, pub := b.Published(), a.Published(); got.ID() != pub.ID() || got.Floor != 1 || !pub.Whole {
		t.Errorf("the replicas publish %+v and %+v, want the refill's lineage, floor 1, whole", pub, got)
	}
}

// TestATableWholeAgainIsReadyHoweverItBecameSo: a refill put off (a batch of the stream before
// waited for the lock) leaves the replica unready; another replica then refills the table and
// notes it whole. The next check finds it whole and the replica ready again. Before, only a refill
// of its own (or a loss resolved) made it ready: it stayed unready for good.
func TestATableWholeAgainIsReadyHoweverItBecameSo(t *testing.T) {
	ctx := t.Context()
	f := newKeeperFixture(t, func(c *Config[rank.Record]) { c.Grace = time.Millisecond })
	now := f.remake(t)
	f.exec(t, "DROP TABLE evaluations")
	f.k.Serial(func() {
		go f.k.Serial(func() {}) // a batch of the stream before, waiting
		testenv.WaitFor(t, 10*time.Second, "the batch waiting for the lock", func() (bool, string) {
			return f.k.waiting.Load() == 1, ""
		})
		if err := f.k.RefillLost(ctx); !errors.Is(err, ErrBeforeInHand) {
			t.Errorf("the refill while a batch of the stream before waits: %v, want ErrBeforeInHand", err)
		}
	})
	if f.k.cfg.View.Whole.Err() == nil {
		t.Fatal("ready while the table is missing")
	}
	// Another replica: the table made again and filled, its lineage noted whole.
	if _, err := f.st.Repair(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.st.NoteLineage(ctx, chstore.Lineage{Epoch: 9, Stream: chstore.StreamID(now.CachedInfo().Created), Era: 1, Floor: 1, Whole: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.k.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.k.cfg.View.Whole.Err(); err != nil {
		t.Fatalf("the table is whole and the replica still unready: %v", err)
	}
}
