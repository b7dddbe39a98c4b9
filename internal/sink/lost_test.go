package sink

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// TestATakeoverOfARefillWhoseRowsAreGoneNamesTheLoss: a refill whose lineage holds era 0 below
// era 1 (floor 0: rows of a deleted stream) stopped; the table was emptied before another replica
// took it over. The takeover checks the loss first (the rows the refill relied on are gone), and
// names it. Before (a review found it), it refilled the table and noted it whole, the era-0 rows
// gone unnamed.
func TestATakeoverOfARefillWhoseRowsAreGoneNamesTheLoss(t *testing.T) {
	ctx := t.Context()
	f := newKeeperFixture(t, func(c *Config[rank.Record]) { c.Grace = time.Millisecond; c.StaleAfter = 200 * time.Millisecond })
	f.kcfg.Losses = auditLosses{nc: f.nc}
	if _, err := events.MakeStreams(ctx, f.js, events.StreamOptions{}, events.StreamAudit); err != nil {
		t.Fatal(err)
	}
	old := []rank.Record{{EventID: "e-old", Seq: 1}}
	old[0].ExecutionID, old[0].TeamID, old[0].TeamName, old[0].RoundNumber = "x", "t", "T", 1
	if err := f.st.Insert(ctx, old); err != nil {
		t.Fatal(err)
	}
	now := f.remake(t) // era 0's stream is gone: its row is kept only in the table
	stopped := chstore.Lineage{Epoch: 5, Stream: chstore.StreamID(now.CachedInfo().Created), Era: 1, Floor: 0, Anchor: chstore.KeyOf(old[0])}
	if err := f.st.NoteLineage(ctx, stopped); err != nil { // a refill (floor 0: it read era 0's row) that stopped
		t.Fatal(err)
	}
	f.exec(t, "TRUNCATE TABLE evaluations")
	k := NewKeeper(f.kcfg) // a replica (re)started
	err := k.Check(ctx)
	lin, _, _ := f.st.Lineage(ctx)
	if !errors.Is(err, ErrLossHeld) {
		t.Errorf("check: %v, lineage noted %+v; want ErrLossHeld naming era 0 (its row is gone and no stream holds it)", err, lin)
	}
}

// TestATableDroppedDuringARefillKeepsItsLossNamed: the table's lineage alone is lost while it
// holds era 0's row (a deleted stream's) and era 1's stream holds a message; the operator drops
// the table at the first write of whatever refill or write follows. However it ends, era 0's row is
// either still held or its loss is named (now or by the next loss of the table): a review found a
// refill that noted the table whole, floor 1, the row gone and never named.
func TestATableDroppedDuringARefillKeepsItsLossNamed(t *testing.T) {
	ctx := t.Context()
	var f *keeperFixture
	dropped := false
	f = newKeeperFixture(t, func(c *Config[rank.Record]) {
		c.Grace = time.Millisecond
		c.Repair = func(ctx context.Context) error { _, err := f.st.Repair(ctx); return err }
	})
	f.kcfg.Losses = auditLosses{nc: f.nc}
	if _, err := events.MakeStreams(ctx, f.js, events.StreamOptions{}, events.StreamAudit); err != nil {
		t.Fatal(err)
	}
	write := f.kcfg.Write
	f.kcfg.Write = func(ctx context.Context, recs []rank.Record) (map[int]error, error) {
		if !dropped { // the operator drops the table while the refill writes
			dropped = true
			f.exec(t, "DROP TABLE evaluations")
			return nil, ErrTableLost
		}
		return write(ctx, recs)
	}
	old := []rank.Record{{EventID: "e-old", Seq: 1}}
	old[0].ExecutionID, old[0].TeamID, old[0].TeamName, old[0].RoundNumber = "x", "t", "T", 1
	if err := f.st.Insert(ctx, old); err != nil {
		t.Fatal(err)
	}
	now := f.remake(t)
	body, _ := events.Marshal("e-new", "test", events.TypeEvaluationCompleted, time.Unix(1, 0), events.EvaluationCompleted{ExecutionID: "x", TeamID: "t2", TeamName: "T2", RoundNumber: 1})
	if _, err := f.js.Publish(ctx, events.EvaluationSubject("x", "t2"), body); err != nil {
		t.Fatal(err)
	}
	if err := f.st.NoteLineage(ctx, chstore.Lineage{Epoch: 3, Stream: chstore.StreamID(now.CachedInfo().Created), Era: 1, Floor: 0, Anchor: chstore.KeyOf(old[0]), Whole: true}); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "DROP TABLE store_lineage") // its lineage alone lost
	k := NewKeeper(f.kcfg)
	if err := k.Publish(ctx, chstore.Lineage{Epoch: 3, Stream: chstore.StreamID(now.CachedInfo().Created), Era: 1, Floor: 0, Anchor: chstore.KeyOf(old[0]), Whole: true}, ""); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := k.Check(cctx)
	lin, _, _ := f.st.Lineage(ctx)
	held, _ := f.st.Holds(ctx, chstore.KeyOf(old[0]))
	if !held && err == nil {
		if _, _, lost := lin.LostEras(lin.Stream); !lost {
			t.Errorf("era 0's row is gone, the refill finished (floor %d, era %d) and no loss was named nor will be", lin.Floor, lin.Era)
		}
	}
}
