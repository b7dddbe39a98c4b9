package chstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/podium-llm/podium/pkg/rank"
)

// The evaluations table is a view of the EVALUATIONS stream, and the store says which one: its
// lineage (table store_lineage, migration 0002) names the stream the rows were derived from and
// the derivation (an epoch), says whether that derivation is whole, and names one row the table
// held (the anchor). A table dropped or recreated has lost its anchor; a stream deleted and made
// again has another creation time; a refill or a rebuild starts a new epoch. Everything derived
// from the store (the ranker's score snapshots) carries Lineage.ID, so any of these invalidates it.

// A refill rewrites the table readers query: from the moment it touches the table until it is
// whole, a read sees part of the rows, or none. The ranker publishes that it refills (its
// consumer's metadata, read by every commit probe) and then waits RefillGrace before it touches
// the table; a composer starts a ClickHouse read only while its newest probe started less than
// ProbeFresh ago and saw no refill. A read that starts at t follows a probe started after
// t-ProbeFresh that saw none: the refill was published after that, so it touches the table after
// t-ProbeFresh+RefillGrace, two seconds later than the read started.
const (
	ProbeFresh  = time.Second
	RefillGrace = 3 * ProbeFresh
)

// RowKey names one stored row (an evaluation, an archived record) by the table's sort key, so a
// lookup reads one granule, and by its position. Of the copies of one key, a merge keeps an early
// one (the evaluations table the lowest sequence, the prompts archive the first stored, which is
// the earliest position: eras follow each other in time, and sequences within one): so the anchor
// is held by a copy of its key at its position or before it (an earlier era, or its own up to its
// sequence), which merges never take away, and not by one stored later, as a replay of it after the
// table was emptied is (another message, at a later sequence; an earlier era's stream is gone). A
// zero Pos (an anchor noted before positions were) matches by the key alone.
type RowKey struct {
	ExecutionID, TeamID, EventID string
	Pos                          rank.Pos
}

// is reports whether a row of the table, by its key and position, holds the anchor k.
func (k RowKey) is(executionID, teamID, eventID string, at rank.Pos) bool {
	return k.ExecutionID == executionID && k.TeamID == teamID && k.EventID == eventID &&
		(k.Pos == rank.Pos{} || at.Era < k.Pos.Era || at.Era == k.Pos.Era && at.Seq <= k.Pos.Seq)
}

// Lineage is what the evaluations table was derived from.
type Lineage struct {
	// Epoch names the current derivation: a refill's or a rebuild's start, or the ranker adopting
	// a table it found (NextEpoch: after every epoch the store holds, so the newest derivation is
	// the one started last, whatever the clocks of the hosts that started them). Nothing rendered
	// or ranked reads it.
	Epoch uint64
	// Stream is the EVALUATIONS stream's identity: its creation time (StreamID).
	Stream string
	// Era is the stream's era (rank.Pos): the rows derived from it are stored with it. A lineage
	// that names another stream than the one before it has the next era.
	Era uint32
	// Floor is the oldest era whose rows the table holds. The rows of eras before Era are of
	// streams deleted since, kept only here: a table lost while Floor < Era has lost them for good
	// (LostEras), which the ranker names and waits on instead of refilling as if whole.
	Floor uint32
	// Anchor is a row the table held when this was noted; zero while the table held none.
	Anchor RowKey
	// Through is how far a refill got: every evaluation up to this stream sequence is stored. A
	// refill that stopped resumes after it while the table still holds the anchor.
	Through uint64
	// Whole is set once every evaluation the stream held when the derivation began is stored.
	Whole bool
	// Noted is its note's version (read back; NoteLineage notes the time of the call, or just
	// after the newest note of the epoch): a refill notes its lineage again every few seconds, so
	// one whose note stops changing has stopped. It orders notes; it is never compared with a
	// clock.
	Noted time.Time
}

// ID is the lineage's name in what is derived from it: epoch and stream, not the anchor (which
// moves within one derivation).
func (l Lineage) ID() string {
	if l.Epoch == 0 {
		return ""
	}
	return strconv.FormatUint(l.Epoch, 10) + "@" + l.Stream
}

// EraOf is the era of the rows of stream in a derivation that follows l (the newest lineage):
// l's own when l names that stream, else the next (the stream was made again since).
func (l Lineage) EraOf(stream string) uint32 {
	if l.Stream == stream || l.Epoch == 0 {
		return l.Era
	}
	return l.Era + 1
}

// LostEras are the eras whose rows a table derived as l held that no stream holds any longer,
// when stream is the EVALUATIONS stream there is now: those before l's era (their streams were
// deleted), and l's own when it names another stream than stream. ok is false when the stream
// still holds everything (a lost table can be refilled whole).
func (l Lineage) LostEras(stream string) (from, to uint32, ok bool) {
	if l.Epoch == 0 {
		return 0, 0, false
	}
	if l.Stream != stream {
		if l.Anchor == (RowKey{}) && l.Floor >= l.Era {
			return 0, 0, false // the table held no row: nothing of its stream to lose
		}
		return min(l.Floor, l.Era), l.Era, true
	}
	if l.Floor < l.Era {
		return l.Floor, l.Era - 1, true
	}
	return 0, 0, false
}

// StreamID is a stream's identity in a lineage: its creation time, which a stream deleted and
// made again under the same name changes.
func StreamID(created time.Time) string { return created.UTC().Format(time.RFC3339Nano) }

// Lineages is where the lineage of one table that is a view of a stream is noted, and the table
// its anchors name: the evaluations table's (Store's own methods: store_lineage) or the prompts
// archive's (ArchiveLineages: archive_lineage). It is what a keeper reads and notes (sink.Table).
type Lineages struct {
	s *Store
	t viewTables
}

// viewTables names a view's tables: where its lineage is noted, the rows, which rows are the
// stream's (the archive's epoch markers, from before it had a lineage, are not), and the column
// that names the stream a row came from (none in the evaluations table: its era alone does).
type viewTables struct{ lineage, rows, streamRows, streamColumn string }

var (
	evaluationsView = viewTables{lineage: "store_lineage", rows: "evaluations", streamRows: "1"}
	archiveView     = viewTables{lineage: "archive_lineage", rows: "prompts", streamRows: "event_type != '" + markerType + "'", streamColumn: "stream_created"}
)

// ArchiveLineages is the prompts archive's lineage (migration 0006).
func (s *Store) ArchiveLineages() *Lineages { return &Lineages{s: s, t: archiveView} }

// The lineage queries, named so that the test comparing ClickHouse 18.16 with a current engine
// (chdb_test.go) runs exactly them.
func (t viewTables) lineageQuery() string {
	return `SELECT epoch, version, stream_created, era, anchor_execution_id, anchor_team_id, anchor_event_id, anchor_era, anchor_seq, through, whole, floor_era
FROM ` + t.lineage + ` ORDER BY epoch DESC, version DESC LIMIT 1`
}
func (t viewTables) holdsQuery() string {
	return `SELECT stream_era, stream_seq FROM ` + t.rows + ` WHERE execution_id = ? AND team_id = ? AND event_id = ?`
}
func (t viewTables) newestRowQuery() string {
	return `SELECT execution_id, team_id, event_id, stream_era, stream_seq FROM ` + t.rows + ` WHERE ` + t.streamRows + ` ORDER BY stream_era DESC, stream_seq DESC, event_id LIMIT 1`
}
func (t viewTables) oldestEraQuery() string {
	return `SELECT min(stream_era) FROM ` + t.rows + ` WHERE ` + t.streamRows
}

// rowStreamsQuery counts the rows of another stream than the one given, and the copies of one row
// at its position of that stream.
func (t viewTables) rowStreamsQuery() string {
	return `SELECT countIf(` + t.streamColumn + ` != ?), countIf(execution_id = ? AND team_id = ? AND event_id = ? AND stream_era = ? AND stream_seq = ? AND ` + t.streamColumn + ` = ?)
FROM ` + t.rows + ` WHERE ` + t.streamRows
}

// Lineage reads the store's lineage (Lineages.Lineage of the evaluations table).
func (s *Store) Lineage(ctx context.Context) (Lineage, bool, error) {
	return (&Lineages{s, evaluationsView}).Lineage(ctx)
}

// NextEpoch is Lineages.NextEpoch of the evaluations table.
func (s *Store) NextEpoch(ctx context.Context, now time.Time) (uint64, error) {
	return (&Lineages{s, evaluationsView}).NextEpoch(ctx, now)
}

// NoteLineage is Lineages.NoteLineage of the evaluations table.
func (s *Store) NoteLineage(ctx context.Context, l Lineage) error {
	return (&Lineages{s, evaluationsView}).NoteLineage(ctx, l)
}

// Holds is Lineages.Holds of the evaluations table.
func (s *Store) Holds(ctx context.Context, k RowKey) (bool, error) {
	return (&Lineages{s, evaluationsView}).Holds(ctx, k)
}

// NewestRow is Lineages.NewestRow of the evaluations table.
func (s *Store) NewestRow(ctx context.Context) (RowKey, bool, error) {
	return (&Lineages{s, evaluationsView}).NewestRow(ctx)
}

// RowStreams is Lineages.RowStreams of the evaluations table.
func (s *Store) RowStreams(ctx context.Context, row RowKey, stream string) (RowStreams, error) {
	return (&Lineages{s, evaluationsView}).RowStreams(ctx, row, stream)
}

// OldestEra is Lineages.OldestEra of the evaluations table.
func (s *Store) OldestEra(ctx context.Context) (uint32, error) {
	return (&Lineages{s, evaluationsView}).OldestEra(ctx)
}

// Lineage reads the table's lineage: the newest noted, by epoch then by when it was noted; false
// when none was ever noted (a store made before lineages, or a new one). On a cluster each replica
// read answers its newest, and the newest of those wins.
func (ls *Lineages) Lineage(ctx context.Context) (Lineage, bool, error) {
	var l Lineage
	var version uint64
	found := false
	err := ls.s.query(ctx, ls.t.lineageQuery(), nil, func(rows driver.Rows) error {
		var r Lineage
		var v uint64
		var whole uint8
		if err := rows.Scan(&r.Epoch, &v, &r.Stream, &r.Era, &r.Anchor.ExecutionID, &r.Anchor.TeamID, &r.Anchor.EventID, &r.Anchor.Pos.Era, &r.Anchor.Pos.Seq, &r.Through, &whole, &r.Floor); err != nil {
			return err
		}
		if found && (r.Epoch < l.Epoch || r.Epoch == l.Epoch && v <= version) {
			return nil
		}
		r.Whole, r.Noted = whole == 1, time.Unix(0, int64(v))
		l, version, found = r, v, true
		return nil
	})
	if err != nil {
		return Lineage{}, false, fmt.Errorf("rank: %s: %w", ls.t.lineage, err)
	}
	return l, found, nil
}

// NextEpoch is the epoch of a new derivation: after every lineage the store holds, whoever noted
// it and whatever that host's clock said (a rebuild from a machine an hour fast must not outrank
// every refill after it): the caller's clock reading when it is later, else one past the newest.
func (ls *Lineages) NextEpoch(ctx context.Context, now time.Time) (uint64, error) {
	newest, found, err := ls.Lineage(ctx)
	if err != nil && FaultOf(err) != Missing {
		return 0, err
	}
	epoch := uint64(max(now.UnixNano(), 1))
	if found && newest.Epoch >= epoch {
		epoch = newest.Epoch + 1
	}
	return epoch, nil
}

// NoteLineage records l as the table's lineage. Within one epoch its notes are ordered by what
// the store holds too: each comes after the newest noted of that epoch, whichever replica noted
// it (one that takes a stopped refill over goes on with its epoch, its clock perhaps behind).
func (ls *Lineages) NoteLineage(ctx context.Context, l Lineage) error {
	whole := uint8(0)
	if l.Whole {
		whole = 1
	}
	now := time.Now()
	version := uint64(now.UnixNano())
	newest, found, err := ls.Lineage(ctx)
	if err != nil && FaultOf(err) != Missing {
		return fmt.Errorf("rank: note lineage: %w", err) // unread, a note could land before the newest and go unseen: tried again
	}
	if found && newest.Epoch == l.Epoch && uint64(newest.Noted.UnixNano()) >= version {
		version = uint64(newest.Noted.UnixNano()) + 1
	}
	err = ls.s.rs.write(ctx, func(conn driver.Conn) error {
		batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+ls.t.lineage+" (epoch, version, stream_created, era, anchor_execution_id, anchor_team_id, anchor_event_id, anchor_era, anchor_seq, through, whole, noted_at, floor_era)")
		if err != nil {
			return err
		}
		defer batch.Abort()
		if err := batch.Append(l.Epoch, version, l.Stream, l.Era, l.Anchor.ExecutionID, l.Anchor.TeamID, l.Anchor.EventID, l.Anchor.Pos.Era, l.Anchor.Pos.Seq, l.Through, whole, now, l.Floor); err != nil {
			return err
		}
		return batch.Send()
	})
	if err != nil {
		return fmt.Errorf("rank: note lineage: %w", err)
	}
	return nil
}

// Holds reports whether the table holds the row k names, at its position.
func (ls *Lineages) Holds(ctx context.Context, k RowKey) (bool, error) {
	held := false
	err := ls.s.query(ctx, ls.t.holdsQuery(), []any{k.ExecutionID, k.TeamID, k.EventID}, func(rows driver.Rows) error {
		var at rank.Pos
		if err := rows.Scan(&at.Era, &at.Seq); err != nil {
			return err
		}
		held = held || k.is(k.ExecutionID, k.TeamID, k.EventID, at)
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("rank: anchor: %w", err)
	}
	return held, nil
}

// NewestRow returns the key of the newest row of the table (the largest era and stream sequence);
// false when it is empty. It reads a column of every row: a keeper asks once, when it adopts a
// table that has no lineage.
func (ls *Lineages) NewestRow(ctx context.Context) (RowKey, bool, error) {
	var k RowKey
	found := false
	err := ls.s.query(ctx, ls.t.newestRowQuery(), nil, func(rows driver.Rows) error {
		found = true
		return rows.Scan(&k.ExecutionID, &k.TeamID, &k.EventID, &k.Pos.Era, &k.Pos.Seq)
	})
	if err != nil {
		return RowKey{}, false, fmt.Errorf("rank: newest row: %w", err)
	}
	return k, found, nil
}

// OldestEra is the oldest era of the rows the table holds (0 when it holds none). It reads a
// column of every row: a keeper asks once, when it adopts a table that lost its lineage.
func (ls *Lineages) OldestEra(ctx context.Context) (uint32, error) {
	eras, err := column[uint32](ctx, ls.s, ls.t.oldestEraQuery())
	if err != nil {
		return 0, fmt.Errorf("rank: oldest era: %w", err)
	}
	oldest := uint32(0)
	for i, e := range eras {
		if i == 0 || e < oldest {
			oldest = e
		}
	}
	return oldest, nil
}

// RowStreams is what a table's rows say of the streams they came from, where they name them.
type RowStreams struct {
	// Named: the rows name their stream (the archive's do, "deleted before ..." included; the
	// evaluations table's do not, and the rest is then false).
	Named bool
	// RowOf: the row asked of is the stream's, at its position.
	RowOf bool
	// Others: some row is of another stream.
	Others bool
}

// RowStreams tells whether row (the newest, say) came from stream (its StreamID), and whether any
// row came from another. It reads a column of every row: a keeper asks once, when it adopts a
// table that has no lineage, whose rows of an era before eras were counted (all 0) may be of
// streams deleted since.
func (ls *Lineages) RowStreams(ctx context.Context, row RowKey, stream string) (RowStreams, error) {
	if ls.t.streamColumn == "" {
		return RowStreams{}, nil
	}
	var others, of uint64
	args := []any{stream, row.ExecutionID, row.TeamID, row.EventID, row.Pos.Era, row.Pos.Seq, stream}
	if err := ls.s.query(ctx, ls.t.rowStreamsQuery(), args, func(rows driver.Rows) error { return rows.Scan(&others, &of) }); err != nil {
		return RowStreams{}, fmt.Errorf("rank: the streams of the rows: %w", err)
	}
	return RowStreams{Named: true, RowOf: of > 0, Others: others > 0}, nil
}

// KeyOf is the row key of a record, with its position.
func KeyOf(r rank.Record) RowKey { return RowKey{r.ExecutionID, r.TeamID, r.EventID, r.Pos()} }
