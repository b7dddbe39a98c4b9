package archiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// keepFixture is an archiver over a real ClickHouse database and a real PROMPTS, with no runtime
// (nothing published on a consumer). These tests were written by a review of the archive's keeper;
// each failed on the code it read.
type keepFixture struct {
	a     *archiver
	st    *chstore.Store
	chCfg chstore.Config
	nc    *nats.Conn
	js    jetstream.JetStream
}

func newKeepFixture(t *testing.T) *keepFixture {
	t.Helper()
	st, chCfg := testenv.Store(t, true)
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(t.Context(), js, events.StreamOptions{}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	m := newMetrics(prometheus.NewRegistry())
	writes, filled := newConditions(health.New(prometheus.NewRegistry(), "archiver"))
	a := &archiver{log: log, js: js, nc: nc, store: st, lineages: st.ArchiveLineages(), m: m, writes: writes, filled: filled,
		sink: newSink(st, m, writes, log), batchSize: 10, batchBytes: 1 << 20, now: time.Now,
		createDatabase: func(ctx context.Context) error { return chstore.CreateDatabase(ctx, chCfg) }}
	return &keepFixture{a: a, st: st, chCfg: chCfg, nc: nc, js: js}
}

func (f *keepFixture) exec(t *testing.T, q string) {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: f.chCfg.Addrs, Auth: clickhouse.Auth{Database: f.chCfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(t.Context(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// publishRecords publishes n prompt.composed records of execution x, team t (rounds 1..n), then
// the extra bodies, and returns every message as a consumer receives it.
func (f *keepFixture) publish(t *testing.T, n int, extra ...[]byte) []jetstream.Msg {
	t.Helper()
	ctx := t.Context()
	for i := 1; i <= n; i++ {
		body := marshal(t, fmt.Sprintf("p-%d", i), events.TypePromptComposed, events.PromptComposed{RequestID: fmt.Sprintf("r-%d", i),
			ExecutionID: "x", TeamID: "t", TeamName: "T", RoundNumber: i, Prompt: "p", Messages: []events.Message{{Role: "user", Content: "hi"}},
			PromptSHA256: "abc", Template: events.TemplateRef{Name: "n", Version: 1}, TokenEncoding: "o200k_base", Truncated: []events.Truncation{}})
		if _, err := f.js.Publish(ctx, events.PromptComposedSubject("x", "t"), body); err != nil {
			t.Fatal(err)
		}
	}
	for _, body := range extra {
		if _, err := f.js.Publish(ctx, events.PromptComposedSubject("x", "t"), body); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := f.js.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(n + len(extra))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
	}
	if len(msgs) != n+len(extra) {
		t.Fatalf("fetched %d, want %d", len(msgs), n+len(extra))
	}
	return msgs
}

func (f *keepFixture) created(t *testing.T) time.Time {
	t.Helper()
	st, err := f.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().Created
}

// TestAnUpgradedArchiveIsAdoptedInItsStreamsEra: an archive made by the archiver before lineages
// (rows of era 0 labelled with the PROMPTS there is now, an epoch marker, no archive_lineage) whose
// newest row is the row of a message that is not a record (the archiver keeps those too). Every row
// is of the stream there is now: the adopted lineage names era 0, floor 0, and a table lost
// afterwards is refilled (the stream holds everything it held). Before, adopt compared the
// message's envelope id with the row's NotARecordID, put the stream in era 1, and a TRUNCATE then
// named a loss that does not exist; now the rows' own stream says.
func TestAnUpgradedArchiveIsAdoptedInItsStreamsEra(t *testing.T) {
	ctx := t.Context()
	f := newKeepFixture(t)
	msgs := f.publish(t, 2, []byte(`not json`))
	at := sink.Origin{Created: f.created(t), Era: 0}
	var rows []chstore.ArchivedPrompt
	for _, msg := range msgs {
		row, _, ok := rowOf(msg, at)
		if !ok {
			t.Fatal("no row")
		}
		rows = append(rows, row)
	}
	rows = append(rows, chstore.ArchivedPrompt{EventID: "epoch-1", EventType: "archive.epoch", Stored: time.Now()}) // the old marker
	if err := f.st.ArchivePrompts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	f.a.keep = f.a.newKeeper(func(c *sink.Config[chstore.ArchivedPrompt]) { c.Grace = time.Millisecond })
	if err := f.a.keep.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	lin, _, err := f.a.lineages.Lineage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lin.Era != 0 || lin.Floor != 0 {
		t.Errorf("adopted the stream there is now in era %d, floor %d; want era 0, floor 0 (every row is of this stream)", lin.Era, lin.Floor)
	}
	// The consequence: the table emptied by hand, while PROMPTS holds every record it held.
	f.exec(t, "TRUNCATE TABLE prompts")
	err = f.a.keep.CheckLocked(ctx)
	if errors.Is(err, sink.ErrLossHeld) {
		t.Errorf("a loss is named although PROMPTS holds every message the table held: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// TestARefillCountsNoRowATruncateTookAway: the table is emptied while a refill writes it (an
// operator, or another replica). The refill checks that the table still holds the first row it
// stored before it notes the lineage whole: the try does not count, and the next one fills the
// table whole. Before, the lineage was noted whole with the last row written as its anchor, every
// check and reader found it, and the records written before the TRUNCATE were missing for good.
func TestARefillCountsNoRowATruncateTookAway(t *testing.T) {
	ctx := t.Context()
	f := newKeepFixture(t)
	f.publish(t, 5)
	f.a.batchBytes = 1 // one record per write of the refill
	var writes atomic.Int32
	f.a.keep = f.a.newKeeper(func(c *sink.Config[chstore.ArchivedPrompt]) {
		c.Grace = time.Millisecond
		write := c.Write
		c.Write = func(ctx context.Context, rows []chstore.ArchivedPrompt) (map[int]error, error) {
			refused, err := write(ctx, rows)
			if writes.Add(1) == 2 {
				f.exec(t, "TRUNCATE TABLE prompts") // p-1 and p-2 are gone
			}
			return refused, err
		}
	})
	// A new archive beside a PROMPTS that holds records: filled first.
	if err := f.a.keep.Check(ctx); err != nil {
		t.Fatal(err)
	}
	lin, _, err := f.a.lineages.Lineage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: "x", Anchor: &lin.Anchor})
	if err != nil {
		t.Fatal(err)
	}
	// The keeper's next check finds nothing wrong.
	if err := f.a.keep.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if lin.Whole && len(got) != 5 {
		t.Errorf("the lineage %s is whole (anchor %s held) but the archive holds %d of the 5 records PROMPTS holds", lin.ID(), lin.Anchor.EventID, len(got))
	}
}

// TestAnUpgradedArchiveNamesTheLossOfADeletedStreamsRecords: an archive made by the archiver before
// lineages holds records of a PROMPTS deleted since (labelled "deleted before ...", era 0 like
// every row then) beside the records of the PROMPTS there is now, whose row is the newest. Before,
// it was adopted in era 0, floor 0, and losing the table refilled it as whole; now the rows that
// name another stream put this one in era 1, and the loss of the deleted stream's records is named.
func TestAnUpgradedArchiveNamesTheLossOfADeletedStreamsRecords(t *testing.T) {
	ctx := t.Context()
	f := newKeepFixture(t)
	msgs := f.publish(t, 2)
	created := f.created(t)
	at := sink.Origin{Created: created, Era: 0}
	var rows []chstore.ArchivedPrompt
	for _, msg := range msgs {
		row, _, _ := rowOf(msg, at)
		rows = append(rows, row)
	}
	// A record of the stream before, as the old archiver labelled it (streamOf).
	old := rows[0]
	old.EventID, old.RequestID, old.Round, old.Seq = "p-old", "r-old", 9, 1
	old.StreamCreated = "deleted before " + created.UTC().Format(time.RFC3339Nano)
	old.Stored = created.Add(-time.Hour)
	rows = append(rows, old, chstore.ArchivedPrompt{EventID: "epoch-1", EventType: "archive.epoch", Stored: time.Now()})
	if err := f.st.ArchivePrompts(ctx, rows); err != nil {
		t.Fatal(err)
	}
	f.a.keep = f.a.newKeeper(func(c *sink.Config[chstore.ArchivedPrompt]) { c.Grace = time.Millisecond })
	if err := f.a.keep.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	lin, _, err := f.a.lineages.Lineage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lin.Era != 1 || lin.Floor != 0 {
		t.Errorf("adopted in era %d, floor %d; want era 1, floor 0", lin.Era, lin.Floor)
	}
	f.exec(t, "TRUNCATE TABLE prompts")
	err = f.a.keep.CheckLocked(ctx)
	if !errors.Is(err, sink.ErrLossHeld) {
		got, _ := f.st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: "x"})
		t.Errorf("the table lost the record of a deleted PROMPTS (p-old) and the check says %v; the archive now holds %d records and is whole: want ErrLossHeld", err, len(got))
	}
}
