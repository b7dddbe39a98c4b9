package chstore_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/rank"
)

// TestArchivedPromptsOncePerEventID: every copy of a record is stored, and reads return one per
// event id (the first the stream stored), in the stream's order, whatever the merge state;
// filters by team and round read only those; a marker is no record.
func TestArchivedPromptsOncePerEventID(t *testing.T) {
	ctx := t.Context()
	st, cfg := testenv.Store(t, true)
	raw, err := clickhouse.Open(&clickhouse.Options{Addr: cfg.Addrs, Auth: clickhouse.Auth{Database: cfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	exec := func(q string) {
		if err := raw.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	at := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	rec := func(team string, round int, seq uint64, body string) chstore.ArchivedPrompt {
		return chstore.ArchivedPrompt{EventID: fmt.Sprintf("prompt-%s-%d", team, round), EventType: "prompt.composed", RequestID: fmt.Sprintf("req-%s-%d", team, round),
			ExecutionID: "x", TeamID: team, Round: round, TemplateName: "team-round", TemplateVersion: 2, EvaluationsSeq: seq * 10,
			Subject: "prompt.composed.x." + team, Body: []byte(body), StreamCreated: "2026-11-26T09:00:00Z", Seq: seq, Stored: at.Add(time.Duration(seq) * time.Millisecond)}
	}
	first := []chstore.ArchivedPrompt{rec("a", 1, 1, "a1"), rec("b", 1, 2, "b1"), rec("a", 2, 3, "a2")}
	if err := st.ArchivePrompts(ctx, first); err != nil {
		t.Fatal(err)
	}
	// A redelivery stores the same record again at a later sequence (a copy past the duplicate
	// window), and the marker of an epoch (the archive's before it had a lineage) sits in the
	// same table.
	again := rec("a", 2, 9, "a2 stored again")
	if err := st.ArchivePrompts(ctx, []chstore.ArchivedPrompt{again, rec("b", 2, 4, "b2")}); err != nil {
		t.Fatal(err)
	}
	if err := st.ArchivePrompts(ctx, []chstore.ArchivedPrompt{{EventID: "epoch-1", EventType: "archive.epoch", Stored: at, Era: 7, Seq: 99}}); err != nil {
		t.Fatal(err)
	}
	for _, merged := range []bool{false, true} {
		if merged {
			exec("OPTIMIZE TABLE prompts FINAL")
		}
		got, err := st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: "x"})
		if err != nil {
			t.Fatal(err)
		}
		var bodies []string
		for _, r := range got {
			bodies = append(bodies, string(r.Body))
		}
		if want := "[a1 b1 a2 b2]"; fmt.Sprint(bodies) != want {
			t.Errorf("merged %v: read %v, want %s", merged, bodies, want)
		}
		if got[2].Seq != 3 || !got[2].Stored.Equal(first[2].Stored) || got[2].EvaluationsSeq != 30 {
			t.Errorf("merged %v: the first copy read back as %+v", merged, got[2])
		}
		n, err := st.ArchivedCount(ctx)
		if err != nil || n != 4 {
			t.Errorf("merged %v: ArchivedCount = %d, %v; want 4", merged, n, err)
		}
	}
	got, err := st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: "x", TeamID: "a", Rounds: []int{2, 7}})
	if err != nil || len(got) != 1 || string(got[0].Body) != "a2" {
		t.Errorf("team a round 2: %+v, %v", got, err)
	}
	// The archive's lineage: its newest row is the newest record (the old marker is not one),
	// its anchor held at its position and not at a later one.
	lineages := st.ArchiveLineages()
	newest, has, err := lineages.NewestRow(ctx)
	if want := first[2].Key(); err != nil || !has || newest.EventID != "prompt-b-2" {
		t.Errorf("NewestRow = %+v, %v, %v; want prompt-b-2 (not the marker, nor %v)", newest, has, err, want)
	}
	for _, c := range []struct {
		key  chstore.RowKey
		want bool
	}{{first[2].Key(), true}, {again.Key(), true}, {chstore.RowKey{ExecutionID: "x", TeamID: "a", EventID: "prompt-a-2", Pos: rank.Pos{Seq: 2}}, false}} {
		if held, err := lineages.Holds(ctx, c.key); err != nil || held != c.want {
			t.Errorf("Holds(%v) = %v, %v; want %v", c.key, held, err, c.want)
		}
	}
	lin := chstore.Lineage{Epoch: 3, Stream: "2026-11-26T09:00:00Z", Anchor: first[2].Key(), Whole: true}
	if err := lineages.NoteLineage(ctx, lin); err != nil {
		t.Fatal(err)
	}
	if got, found, err := lineages.Lineage(ctx); err != nil || !found || got.ID() != lin.ID() || got.Anchor != lin.Anchor {
		t.Errorf("the archive's lineage read back as %+v, %v, %v; want %+v", got, found, err, lin)
	}
	if got, found, err := st.Lineage(ctx); err != nil || found {
		t.Errorf("the store's lineage is %+v, %v, %v: the archive's was noted in the store's table", got, found, err)
	}
	// An anchored read reads the anchor in the same query, and returns only what it asked for.
	anchor := first[2].Key() // team a's
	got, err = st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: "x", TeamID: "b", Anchor: &anchor})
	if err != nil || len(got) != 2 || string(got[0].Body) != "b1" || string(got[1].Body) != "b2" {
		t.Errorf("team b anchored on team a's record: %+v, %v; want b1 and b2", got, err)
	}
	exec("TRUNCATE TABLE prompts")
	if got, err := st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: "x", Anchor: &anchor}); !errors.Is(err, chstore.ErrArchiveAnchorLost) {
		t.Errorf("an anchored read of the emptied table: %+v, %v; want ErrArchiveAnchorLost", got, err)
	}
	exec("DROP TABLE prompts")
	if _, err := lineages.Holds(ctx, lin.Anchor); chstore.FaultOf(err) != chstore.Missing {
		t.Errorf("after the drop: Holds = %v, want a missing table", err)
	}
}

// TestAnArchiveAnchorSurvivesAMerge: the prompts table's merge keeps the first stored copy of a
// record, whatever its sequence: a record sent again to a PROMPTS made again (era 1, sequence 3)
// beside its copy of the stream before (era 0, sequence 500, stored earlier). Before, an anchor on
// the era-1 copy was held by a copy at its sequence or before only, so the merge, keeping the
// era-0 copy (500 > 3), "lost" it though nothing was lost: the keeper refilled (naming a loss) and
// readers stopped reading the archive. Now a copy of an earlier era holds it too (found by review).
func TestAnArchiveAnchorSurvivesAMerge(t *testing.T) {
	ctx := t.Context()
	st, cfg := testenv.Store(t, true)
	at := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	rec := chstore.ArchivedPrompt{ExecutionID: "x", TeamID: "a", Round: 1, EventID: "prompt-a-1", EventType: "prompt.composed",
		Subject: "prompt.composed.x.a", Body: []byte("{}")}
	before, again := rec, rec
	before.StreamCreated, before.Era, before.Seq, before.Stored = "2026-11-26T08:00:00Z", 0, 500, at
	again.StreamCreated, again.Era, again.Seq, again.Stored = "2026-11-26T10:00:00Z", 1, 3, at.Add(2*time.Hour)
	if err := st.ArchivePrompts(ctx, []chstore.ArchivedPrompt{before}); err != nil {
		t.Fatal(err)
	}
	if err := st.ArchivePrompts(ctx, []chstore.ArchivedPrompt{again}); err != nil {
		t.Fatal(err)
	}
	lineages := st.ArchiveLineages()
	anchor := again.Key()
	if held, err := lineages.Holds(ctx, anchor); err != nil || !held {
		t.Fatalf("before the merge: Holds = %v, %v", held, err)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: cfg.Addrs, Auth: clickhouse.Auth{Database: cfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "OPTIMIZE TABLE prompts FINAL"); err != nil {
		t.Fatal(err)
	}
	if held, err := lineages.Holds(ctx, anchor); err != nil || !held {
		t.Errorf("after a merge: Holds(anchor era 1 seq 3) = %v, %v; the table lost nothing (it holds the record's first copy)", held, err)
	}
	if _, err := st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: "x", Anchor: &anchor}); err != nil {
		t.Errorf("an anchored read after a merge: %v", err)
	}
}
