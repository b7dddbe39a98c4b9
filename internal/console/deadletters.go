package console

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/podium-llm/podium/pkg/events"
)

// deadLettersPerPage is the length of a page of dead letters.
const deadLettersPerPage = 50

type deadLettersPage struct {
	Rows       []deadLetterRow
	Total      uint64
	Older      uint64 // the before= of the next page, 0 when this is the last
	NoStream   bool
	FirstShown uint64
}

type deadLetterRow struct {
	Seq               uint64
	Time              string
	Subject           string
	Reason            string
	Stream, StreamSeq string
	Bytes             int
	Truncated         string
}

// deadletters is GET /deadletters[?before=SEQ]: the DEADLETTER stream, newest first, read one
// message at a time backwards by sequence (a page reads at most its own length of messages
// plus the gaps of deleted ones, which are skipped).
func (c *Console) deadletters(r *http.Request, _ evaluations) (any, error) {
	ctx := r.Context()
	s, err := c.d.JS.Stream(ctx, events.StreamDeadLetter)
	if isNotFound(err) {
		return deadLettersPage{NoStream: true}, nil
	}
	if err != nil {
		return nil, err
	}
	state := s.CachedInfo().State
	p := deadLettersPage{Total: state.Msgs}
	before := state.LastSeq + 1
	if b := r.URL.Query().Get("before"); b != "" {
		n, err := strconv.ParseUint(b, 10, 64)
		if err != nil || n == 0 {
			return nil, badRequest("before must be a DEADLETTER sequence, got %s", events.Quote(b))
		}
		before = min(n, before)
	}
	seq := before
	for seq > state.FirstSeq && seq > 1 && len(p.Rows) < deadLettersPerPage {
		seq--
		m, err := s.GetMsg(ctx, seq)
		if isNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		row := deadLetterRow{Seq: m.Sequence, Time: m.Time.UTC().Format("2006-01-02 15:04:05Z"),
			Subject: strings.TrimPrefix(m.Subject, "deadletter."), Reason: m.Header.Get(events.HeaderDeadReason),
			Stream: m.Header.Get(events.HeaderDeadStream), StreamSeq: m.Header.Get(events.HeaderDeadSequence),
			Bytes: len(m.Data), Truncated: m.Header.Get(events.HeaderDeadTruncated)}
		p.Rows = append(p.Rows, row)
	}
	if seq > state.FirstSeq && seq > 1 && state.Msgs > 0 {
		p.Older = seq
	}
	return p, nil
}
