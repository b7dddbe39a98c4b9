package chstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/podium-llm/podium/pkg/rank"
)

// The prompts archive (schemas/clickhouse/0003_prompts.sql) keeps every record of the PROMPTS
// audit stream in ClickHouse, the CloudEvent byte for byte, so the audit lasts however short the
// stream's retention. It lives beside the evaluations, on the same node or replicas, written
// with the same quorum.

// ArchivedPrompt is one record of PROMPTS as the archive keeps it: the stored body and where the
// stream had it, plus the columns readers select on.
type ArchivedPrompt struct {
	EventID         string
	EventType       string // events.TypePromptComposed or events.TypePromptFailed
	RequestID       string
	ExecutionID     string
	TeamID          string
	Round           int
	TemplateName    string // empty for prompt.failed
	TemplateVersion int
	EvaluationsSeq  uint64
	PromptSHA256    string
	Subject         string
	Body            []byte // the CloudEvent as the stream stored it
	StreamCreated   string // the PROMPTS stream's creation time, RFC 3339: its identity
	Seq             uint64 // its sequence in that stream
	Era             uint32 // that stream's era (0006_archive_lineage.sql)
	Stored          time.Time
}

// Key is the record's row key and position: what an anchor of the archive names.
func (r ArchivedPrompt) Key() RowKey {
	return RowKey{ExecutionID: r.ExecutionID, TeamID: r.TeamID, EventID: r.EventID, Pos: rank.Pos{Era: r.Era, Seq: r.Seq}}
}

// NotARecordType is the event type of the archive's row of a PROMPTS message that is not a record
// (the archiver dead-letters it): its bytes kept at its position for the audit log alone, so that a
// check finds the position held once the stream's retention trimmed it. It names no execution (no
// reader of records selects it) and its event id is its position's (one row per position).
const NotARecordType = "podium.not_a_record"

// NotARecordID is the event id of the row of the message that is not a record at seq of the PROMPTS
// named streamCreated.
func NotARecordID(streamCreated string, seq uint64) string {
	return fmt.Sprintf("not-a-record@%s#%d", streamCreated, seq)
}

// ArchivePrompts writes records in one batch. Writing a record again is harmless: reads keep
// the first stored copy of an event id.
func (s *Store) ArchivePrompts(ctx context.Context, recs []ArchivedPrompt) error {
	if len(recs) == 0 {
		return nil
	}
	err := s.rs.write(ctx, func(conn driver.Conn) error {
		batch, err := conn.PrepareBatch(ctx, `INSERT INTO prompts (execution_id, team_id, round_number, event_id,
		event_type, request_id, template_name, template_version, evaluations_seq, prompt_sha256, subject, body,
		stream_created, stream_seq, stream_era, stored_at_us)`)
		if err != nil {
			return err
		}
		defer batch.Abort()
		// One column at a time, each a slice: the driver copies a column whole instead of
		// converting every value of every row through reflection (the body, most of the bytes,
		// is copied once).
		for i, col := range archiveBatchColumns(recs) {
			if err := batch.Column(i).Append(col); err != nil {
				return &clientConversion{fmt.Errorf("append column %d of %d records: %w", i, len(recs), err)}
			}
		}
		return batch.Send()
	})
	if err != nil {
		return fmt.Errorf("rank: archive %d prompts: %w", len(recs), err)
	}
	return nil
}

// archiveBatchColumns are recs as the columns of ArchivePrompts' INSERT, in its order.
func archiveBatchColumns(recs []ArchivedPrompt) []any {
	n := len(recs)
	var (
		execs, teams, ids, types, requests, names = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		shas, subjects, bodies, streams           = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		rounds, versions                          = make([]uint32, n), make([]uint32, n)
		evalSeqs, seqs                            = make([]uint64, n), make([]uint64, n)
		eras                                      = make([]uint32, n)
		stored                                    = make([]int64, n)
	)
	for i, r := range recs {
		execs[i], teams[i], rounds[i], ids[i], types[i], requests[i] = r.ExecutionID, r.TeamID, uint32(r.Round), r.EventID, r.EventType, r.RequestID
		names[i], versions[i], evalSeqs[i], shas[i], subjects[i], bodies[i] = r.TemplateName, uint32(r.TemplateVersion), r.EvaluationsSeq, r.PromptSHA256, r.Subject, bodyString(r.Body)
		streams[i], seqs[i], eras[i], stored[i] = r.StreamCreated, r.Seq, r.Era, r.Stored.UnixMicro()
	}
	return []any{execs, teams, rounds, ids, types, requests, names, versions, evalSeqs, shas, subjects, bodies, streams, seqs, eras, stored}
}

// bodyString is a record's body as the string the driver's column takes, without copying it: the
// driver copies it into the batch before Append returns, and nothing changes a body meanwhile
// (it is the message as the stream delivered it). A copy here cost as much CPU as the copy the
// batch makes anyway.
func bodyString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// PromptFilter selects archived records: one execution, optionally one team, optionally some
// rounds (none: every round).
type PromptFilter struct {
	ExecutionID string
	TeamID      string
	Rounds      []int
	// Anchor, when set, is the anchor of the archive's lineage the reader serves: it is read in
	// the same query as the records (chstore/anchored.go), and a read that does not find it fails
	// with ErrArchiveAnchorLost instead of answering from a table emptied or made again.
	Anchor *RowKey
}

// ErrArchiveAnchorLost is an anchored read of the archive that did not find its anchor row.
var ErrArchiveAnchorLost = errors.New("the prompts table no longer holds the row its lineage is anchored on (emptied, or dropped and made again): the archiver fills it again from PROMPTS")

// wants reports whether a row read is one f asked for (and not only the anchor).
func (f PromptFilter) wants(r ArchivedPrompt) bool {
	return r.ExecutionID == f.ExecutionID && (f.TeamID == "" || r.TeamID == f.TeamID) && (len(f.Rounds) == 0 || slices.Contains(f.Rounds, r.Round))
}

// archiveColumns are the columns a read of the archive returns.
const archiveColumns = `execution_id, team_id, round_number, event_id, event_type, request_id, template_name,
template_version, evaluations_seq, prompt_sha256, subject, body, stream_created, stream_seq, stream_era, stored_at_us`

// promptsQuery reads one execution's records, or one team's: a prefix of the sort key, so only
// their granules are read; with an anchor, its row too (the primary index serves both).
func promptsQuery(f PromptFilter) (string, []any) {
	where, args := `execution_id = ?`, []any{f.ExecutionID}
	if f.TeamID != "" {
		where, args = where+` AND team_id = ?`, append(args, f.TeamID)
	}
	if len(f.Rounds) > 0 {
		rounds := clickhouse.GroupSet{Value: make([]any, len(f.Rounds))}
		for i, r := range f.Rounds {
			rounds.Value[i] = uint32(max(r, 0))
		}
		where, args = where+` AND round_number IN ?`, append(args, rounds)
	}
	if k := f.Anchor; k != nil {
		cond, anchorArgs := k.condition()
		where, args = `(`+where+`) OR `+cond, append(args, anchorArgs...)
	}
	return `SELECT ` + archiveColumns + ` FROM prompts WHERE ` + where, args
}

// ArchivedPrompts reads the archived records f selects, one per event id (its first stored
// copy, storedBefore), in the order the stream stored them.
func (s *Store) ArchivedPrompts(ctx context.Context, f PromptFilter) ([]ArchivedPrompt, error) {
	q, args := promptsQuery(f)
	first := map[string]ArchivedPrompt{}
	anchored := false
	err := s.query(ctx, q, args, func(rows driver.Rows) error {
		var r ArchivedPrompt
		var round, version uint32
		var body string
		var stored int64
		if err := rows.Scan(&r.ExecutionID, &r.TeamID, &round, &r.EventID, &r.EventType, &r.RequestID, &r.TemplateName,
			&version, &r.EvaluationsSeq, &r.PromptSHA256, &r.Subject, &body, &r.StreamCreated, &r.Seq, &r.Era, &stored); err != nil {
			return err
		}
		r.Round, r.TemplateVersion, r.Body, r.Stored = int(round), int(version), []byte(body), time.UnixMicro(stored).UTC()
		if a := f.Anchor; a != nil && a.is(r.ExecutionID, r.TeamID, r.EventID, rank.Pos{Era: r.Era, Seq: r.Seq}) {
			anchored = true
		}
		if !f.wants(r) {
			return nil // the anchor row only
		}
		if have, ok := first[r.EventID]; !ok || storedBefore(r, have) {
			first[r.EventID] = r
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rank: archived prompts of %s: %w", f.ExecutionID, err)
	}
	if f.Anchor != nil && !anchored {
		return nil, fmt.Errorf("%w (anchor %s/%s/%s at %d:%d)", ErrArchiveAnchorLost, f.Anchor.ExecutionID, f.Anchor.TeamID, f.Anchor.EventID, f.Anchor.Pos.Era, f.Anchor.Pos.Seq)
	}
	out := make([]ArchivedPrompt, 0, len(first))
	for _, r := range first {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b ArchivedPrompt) int {
		if storedBefore(a, b) {
			return -1
		}
		if storedBefore(b, a) {
			return 1
		}
		return 0
	})
	return out, nil
}

// storedBefore orders records as the stream stored them: by the time it stored them (a stream
// made again starts its sequences over; within one stream time and sequence agree), then by
// sequence, stream and event id, so that the order is total. The table's version is the same
// rule (keep_version), so a merge keeps the copy reads keep.
func storedBefore(a, b ArchivedPrompt) bool {
	if !a.Stored.Equal(b.Stored) {
		return a.Stored.Before(b.Stored)
	}
	return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.StreamCreated, b.StreamCreated), cmp.Compare(a.EventID, b.EventID)) < 0
}

// ArchiveRowsOf hands yield every row the archive holds of the PROMPTS created at created, each
// copy (a record written twice is two rows until a merge), in no particular order: an audit of
// the archive against the stream (internal/auditlog) reads them all, and names a copy that differs.
func (s *Store) ArchiveRowsOf(ctx context.Context, created time.Time, yield func(seq uint64, subject string, body []byte, eventID string) error) error {
	q := `SELECT stream_seq, subject, body, event_id FROM prompts WHERE stream_created = ?`
	err := s.query(ctx, q, []any{created.UTC().Format(time.RFC3339Nano)}, func(rows driver.Rows) error {
		var seq uint64
		var subject, body, id string
		if err := rows.Scan(&seq, &subject, &body, &id); err != nil {
			return err
		}
		return yield(seq, subject, []byte(body), id)
	})
	if err != nil {
		return fmt.Errorf("rank: the archive's rows: %w", err)
	}
	return nil
}

// ArchivedBetween hands every row of the archive at a sequence of the PROMPTS created at created
// between after and before (both excluded), every copy, in no order (a quorum read hands each
// replica's): the audit log's keeper reads what PROMPTS' retention trimmed before the log reached
// it, and refuses a sequence held in different rows.
func (s *Store) ArchivedBetween(ctx context.Context, created time.Time, after, before uint64, yield func(seq uint64, subject string, body []byte) error) error {
	q := `SELECT stream_seq, subject, body FROM prompts WHERE stream_created = ? AND stream_seq > ? AND stream_seq < ?`
	err := s.query(ctx, q, []any{created.UTC().Format(time.RFC3339Nano), after, before}, func(rows driver.Rows) error {
		var seq uint64
		var subject, body string
		if err := rows.Scan(&seq, &subject, &body); err != nil {
			return err
		}
		return yield(seq, subject, []byte(body))
	})
	if err != nil {
		return fmt.Errorf("rank: the archive's rows from %d: %w", after+1, err)
	}
	return nil
}

// ArchiveStreams is every stream_created the archive's rows name: the creation time of each
// PROMPTS they came from, or "deleted before" one.
func (s *Store) ArchiveStreams(ctx context.Context) ([]string, error) {
	out, err := column[string](ctx, s, `SELECT DISTINCT stream_created FROM prompts`)
	if err != nil {
		return nil, fmt.Errorf("rank: the archive's streams: %w", err)
	}
	return out, nil
}

// ArchiveRowsDeletedBefore hands every row of a record its stream delivered after that stream was
// deleted (the archiver names it "deleted before" the creation of the stream it found there then:
// internal/archiver, streamOf), with the time after "deleted before". Such a row is of the last
// PROMPTS created before that time.
func (s *Store) ArchiveRowsDeletedBefore(ctx context.Context, yield func(before string, seq uint64, subject string, body []byte, eventID string) error) error {
	const prefix = "deleted before "
	q := `SELECT stream_created, stream_seq, subject, body, event_id FROM prompts WHERE stream_created LIKE 'deleted before %'`
	err := s.query(ctx, q, nil, func(rows driver.Rows) error {
		var seq uint64
		var created, subject, body, id string
		if err := rows.Scan(&created, &seq, &subject, &body, &id); err != nil {
			return err
		}
		return yield(strings.TrimPrefix(created, prefix), seq, subject, []byte(body), id)
	})
	if err != nil {
		return fmt.Errorf("rank: the archive's rows of deleted streams: %w", err)
	}
	return nil
}

// ArchivedCount is the number of distinct records the archive holds (the soak and the capacity
// benchmark compare it with the stream).
func (s *Store) ArchivedCount(ctx context.Context) (uint64, error) {
	var n uint64
	err := s.query(ctx, `SELECT uniqExact(event_id) FROM prompts WHERE execution_id != ''`, nil, func(rows driver.Rows) error { return rows.Scan(&n) })
	if err != nil {
		return 0, fmt.Errorf("rank: count archived prompts: %w", err)
	}
	return n, nil
}

// markerType is the event type of the marker rows the archive kept before it had a lineage (an
// epoch per fill, execution and team empty): no record, never an anchor (archiveView).
const markerType = "archive.epoch"

// TemplateExecutions are the executions the archive holds prompts of a template name of, sorted.
func (s *Store) TemplateExecutions(ctx context.Context, name string) ([]string, error) {
	out, err := column[string](ctx, s, `SELECT DISTINCT execution_id FROM prompts WHERE template_name = ? AND event_type = 'prompt.composed' ORDER BY execution_id`, name)
	if err != nil {
		return nil, fmt.Errorf("rank: executions of template %s: %w", name, err)
	}
	return out, nil
}
