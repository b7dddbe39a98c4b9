package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
)

// Archive is what a Source reads of the prompts archive (chstore.Store; the read-only account is
// enough).
type Archive interface {
	ArchivedPrompts(ctx context.Context, f chstore.PromptFilter) ([]chstore.ArchivedPrompt, error)
	// ArchiveLineages is where the archive's lineage is noted (and its anchor looked up).
	ArchiveLineages() *chstore.Lineages
}

var _ Archive = (*chstore.Store)(nil)

// Source reads prompt.composed records: those the archiver has stored from ClickHouse, and from
// the PROMPTS stream only the tail it has not archived yet. So a read costs the same whatever the
// size of the audit, and records trimmed from the stream by its retention are still read.
//
// The archive is used only while it is whole: the archiver's consumer names a lineage
// (events.MetaArchiveLineage) and no refill, the archive's newest lineage is that one, whole, and
// the table holds its anchor row at its position, read in the same query as the records. Everything at or below the
// consumer's ack floor of the stream as it is now is in the table then (the archiver acks a
// record only once ClickHouse has it); rows of an earlier PROMPTS (deleted and made again) are
// read from the table alone. Otherwise (no archiver, a table dropped or being filled again) the
// stream is read, as before the archive.
type Source struct {
	JS      jetstream.JetStream
	Archive Archive // nil: the stream alone
}

// Query selects the records of one execution, optionally one team and some rounds.
type Query struct {
	ExecutionID string
	TeamID      string // "": every team
	Rounds      []int  // none: every round
	// Failed asks for the prompt.failed records too (Record.Failed set); verifiers never do.
	Failed bool
}

func (q Query) filter() string {
	team := q.TeamID
	if team == "" {
		team = "*"
	}
	kind := events.TypePromptComposed
	if q.Failed {
		kind = "prompt.*"
	}
	return kind + "." + q.ExecutionID + "." + team
}

func (q Query) wants(r Record) bool {
	return len(q.Rounds) == 0 || slices.Contains(q.Rounds, r.Data.RoundNumber)
}

// Records reads the prompt.composed records q selects (and prompt.failed with q.Failed), in the
// order PROMPTS stored them. Where the archive cannot be read and the stream no longer holds its
// first records (its retention trimmed them), it fails rather than return part of the audit.
func (s Source) Records(ctx context.Context, q Query) ([]Record, error) {
	// The archive's state is read before its rows and checked again after them: a table made
	// again, or a stream made again, in between would give rows of another fill.
	for range 3 {
		out, changed, err := s.records(ctx, q)
		if !changed {
			return out, err
		}
	}
	return nil, errors.New("audit: the prompts archive or PROMPTS kept changing while they were read; try again")
}

// records is one try of Records; changed when the archive's state moved while it read.
func (s Source) records(ctx context.Context, q Query) ([]Record, bool, error) {
	m, err := s.archived(ctx)
	if err != nil {
		return nil, false, err
	}
	var out []Record
	after := uint64(0)
	if m.usable {
		f := chstore.PromptFilter{ExecutionID: q.ExecutionID, TeamID: q.TeamID, Rounds: q.Rounds}
		if m.anchor != (chstore.RowKey{}) {
			f.Anchor = &m.anchor // in the same query: a table emptied since the mark is not read short
		}
		rows, err := s.Archive.ArchivedPrompts(ctx, f)
		if errors.Is(err, chstore.ErrArchiveAnchorLost) {
			return nil, true, nil // read again: the next mark finds the archive not whole
		}
		if err != nil {
			return nil, false, err
		}
		// The same fill of the same stream still: the floor may have moved on meanwhile, which
		// changes nothing (the table holds at least what it held at the first floor).
		if again, err := s.archived(ctx); err != nil || !again.usable || again.lineage != m.lineage || again.created != m.created {
			return nil, true, err
		}
		for _, row := range rows {
			if row.EventType != events.TypePromptComposed && !(q.Failed && row.EventType == events.TypePromptFailed) ||
				row.StreamCreated == m.created && row.Seq > m.floor {
				continue // a failure, or a record of the tail: read from the stream below
			}
			r, err := fromArchive(row)
			if err != nil {
				return nil, false, err
			}
			out = append(out, r)
		}
		after = m.floor
		if !tailHolds(ctx, m.stream, q.filter(), after) {
			return out, false, nil
		}
	} else if m.firstSeq > 1 {
		return nil, false, fmt.Errorf("audit: %s no longer holds its records before sequence %d (its retention trimmed them) and the prompts archive cannot be read (%s): the records would be incomplete", events.StreamPrompts, m.firstSeq, m.why)
	}
	_, err = streamscan.Scan(ctx, s.JS, events.StreamPrompts, q.filter(), after, func(msg jetstream.Msg) error {
		r, err := record(msg)
		if err == nil && q.wants(r) {
			out = append(out, r)
		}
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return out, false, nil
}

// fromArchive reads an archived row. A row whose columns do not say what its body says was
// changed in ClickHouse after it was archived: that is a *Mismatch naming it, as a record that
// does not render again is.
func fromArchive(row chstore.ArchivedPrompt) (Record, error) {
	where := fmt.Sprintf("archived record %s (%s %s round %d, PROMPTS sequence %d)", row.EventID, row.ExecutionID, row.TeamID, row.Round, row.Seq)
	r, err := Decode(row.Subject, row.Body)
	if err != nil {
		return Record{}, differs("%s: its body does not decode: %v", where, err)
	}
	d := r.Data
	kind := events.TypePromptComposed
	if r.Failed != nil {
		kind = events.TypePromptFailed
	}
	for _, c := range []struct {
		column      string
		row, record any
	}{
		{"event_type", row.EventType, kind},
		{"event_id", row.EventID, r.EventID},
		{"execution_id", row.ExecutionID, d.ExecutionID},
		{"team_id", row.TeamID, d.TeamID},
		{"round_number", row.Round, d.RoundNumber},
		{"request_id", row.RequestID, d.RequestID},
		{"template_name", row.TemplateName, d.Template.Name},
		{"template_version", row.TemplateVersion, d.Template.Version},
		{"evaluations_seq", row.EvaluationsSeq, d.Inputs.EvaluationsSeq},
		{"prompt_sha256", row.PromptSHA256, d.PromptSHA256},
		{"subject", row.Subject, kind + "." + d.ExecutionID + "." + d.TeamID},
	} {
		if c.row != c.record {
			return Record{}, differs("%s was changed in ClickHouse: its %s is %v, its body says %v", where, c.column, c.row, c.record)
		}
	}
	r.Seq, r.Stored, r.Archived, r.Raw = row.Seq, row.Stored, true, row.Body
	return r, nil
}

// Rounds reads the latest prompt.composed of each of the rounds asked of one team: a round with
// none is absent.
func (s Source) Rounds(ctx context.Context, exec, team string, rounds ...int) (map[int]Record, error) {
	recs, err := s.Records(ctx, Query{ExecutionID: exec, TeamID: team, Rounds: rounds})
	if err != nil {
		return nil, err
	}
	out := make(map[int]Record, len(rounds))
	for _, r := range recs {
		out[r.Data.RoundNumber] = r // later is latest, as Latest takes it
	}
	return out, nil
}

// mark is how far the archive holds the stream: every record at or below floor of the PROMPTS
// created then, in the derivation lineage names; or why it is not to be read.
type mark struct {
	stream   jetstream.Stream // PROMPTS, as looked up for this mark
	usable   bool
	floor    uint64
	created  string
	lineage  string
	anchor   chstore.RowKey // the lineage's anchor row (zero: it held none)
	why      string         // when not usable
	firstSeq uint64         // the stream's first sequence now
}

// archived says how far the archive holds the stream, and whether it is to be read at all (none,
// not whole, or the archiver's consumer is not there).
func (s Source) archived(ctx context.Context) (mark, error) {
	st, err := s.JS.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return mark{}, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	m := mark{stream: st, firstSeq: st.CachedInfo().State.FirstSeq, created: st.CachedInfo().Created.UTC().Format(time.RFC3339Nano)}
	if s.Archive == nil {
		m.why = "no ClickHouse"
		return m, nil
	}
	cons, err := st.Consumer(ctx, events.ConsumerArchiver)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		m.why = "no archiver consumer"
		return m, nil
	}
	if err != nil {
		return mark{}, fmt.Errorf("read the archiver's consumer: %w", err)
	}
	info := cons.CachedInfo()
	md := info.Config.Metadata
	named, ok := sink.ArchiveKeys.LineageOf(md)
	if !ok {
		m.why = "the archiver names no lineage of the archive yet"
		return m, nil
	}
	if why := md[events.MetaArchiveRefilling]; why != "" {
		m.why = "the archive is being filled again: " + why
		return m, nil
	}
	m.lineage = named.ID()
	lineages := s.Archive.ArchiveLineages()
	lin, found, err := lineages.Lineage(ctx)
	switch {
	case err != nil:
		m.why = "ClickHouse: " + err.Error()
		return m, nil
	case !found || lin.ID() != m.lineage || !lin.Whole:
		m.why = "the archive's lineage is not " + m.lineage + " whole (being filled again, or lost)"
		return m, nil
	}
	if lin.Anchor != (chstore.RowKey{}) {
		held, err := lineages.Holds(ctx, lin.Anchor)
		switch {
		case err != nil:
			m.why = "ClickHouse: " + err.Error()
			return m, nil
		case !held:
			m.why = "the prompts table lost its anchor row (emptied, or made again): not the archive " + m.lineage
			return m, nil
		}
	}
	m.usable, m.floor, m.anchor = true, info.AckFloor.Stream, lin.Anchor
	return m, nil
}

// tailHolds reports whether the stream holds a record on filter after seq: one direct lookup, so a
// read of archived records scans nothing.
func tailHolds(ctx context.Context, st jetstream.Stream, filter string, after uint64) bool {
	_, err := st.GetMsg(ctx, after+1, jetstream.WithGetMsgSubject(filter))
	return !errors.Is(err, jetstream.ErrMsgNotFound)
}
