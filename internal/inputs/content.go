package inputs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// contentReads is how the composer reads its teams' own content (submissions, feedback,
// metrics) from ClickHouse, when the stream cannot give it: the batcher reads the teams that
// asked meanwhile together (at most maxBatch teams a query), so a round of ten teams costs one
// or two queries rather than ten, while no request ever reads another team's content.
//
// A request joins only a read that starts after it asked, after its read-your-writes wait: the
// read then holds every evaluation the request's pinned reduction can choose. Content is never
// kept, so nothing else needs a rule.
type contentReads struct {
	read func(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int) (map[rank.TeamKey]*rank.Content, error)
	b    *batcher[rank.TeamKey, [2]int, *rank.Content]
}

func newContentReads(read func(context.Context, []rank.TeamKey, int, int) (map[rank.TeamKey]*rank.Content, error), m *Metrics) *contentReads {
	r := &contentReads{read: read}
	r.b = newBatcher(maxQueries, maxBatch, r.fetch)
	r.b.ran = func(_ map[rank.TeamKey][][2]int, took time.Duration) { m.contentRead.Observe(took.Seconds()) }
	return r
}

// get returns the content of one team in rounds from to before-1 (a batch may hold more rounds:
// more content than a prompt prints changes nothing in it).
func (r *contentReads) get(ctx context.Context, key rank.TeamKey, from, before int) (*rank.Content, error) {
	c, _, err := r.b.get(ctx, key, [2]int{from, before})
	return c, err
}

// fetch reads the teams of a batch in one query, over the rounds all of them need.
func (r *contentReads) fetch(ctx context.Context, batch map[rank.TeamKey][][2]int) (map[rank.TeamKey]*rank.Content, error) {
	keys := slices.SortedFunc(maps.Keys(batch), func(a, b rank.TeamKey) int {
		return cmp.Or(cmp.Compare(a.ExecutionID, b.ExecutionID), cmp.Compare(a.TeamID, b.TeamID))
	})
	first := batch[keys[0]][0]
	from, before := first[0], first[1]
	for _, spans := range batch {
		for _, s := range spans {
			from, before = min(from, s[0]), max(before, s[1])
		}
	}
	return r.read(ctx, keys, from, before)
}

// streamContent reads a team's content (submissions, feedback, metrics) from the EVALUATIONS
// stream, one message per evaluation the prompt counts, by the sequence its score row already
// holds (a direct get, which any stream replica serves). ClickHouse then reads score rows only:
// a content query decoded whole granules of other executions' submissions to return five rows,
// and cost ClickHouse more CPU than the prompt it served.
//
// The message is the evaluation as the ranker received it; parsed the same way, it gives
// exactly the row the ranker stored (rank.Content.Add). When the stream cannot give a team's
// content (a message deleted by an operator's retention, one that is not the evaluation the row
// names, a stream reconfigured or out of reach), the whole team is read from ClickHouse instead
// (fallback), so a prompt is never short of content; the stream is looked up afresh next time.
//
// At most maxFetches messages are fetched at once across all requests: a message and its parse
// hold about four times its size, and a submission may be 900 KB.
type streamContent struct {
	js       jetstream.JetStream
	maxBytes int
	fallback func(ctx context.Context, key rank.TeamKey, from, before int) (*rank.Content, error)
	m        *Metrics
	fetches  chan struct{} // capacity maxFetches

	stream *evaluationsStream // its cached config says whether direct gets work
	// lineage says the era of the stream now (rank.Pos): a ref of another era is of a stream
	// deleted since, whose sequences mean nothing in this one.
	lineage *lineage
}

const maxFetches = 16

func newStreamContent(js jetstream.JetStream, stream *evaluationsStream, l *lineage, maxBytes int, fallback func(context.Context, rank.TeamKey, int, int) (*rank.Content, error), m *Metrics) *streamContent {
	return &streamContent{js: js, maxBytes: maxBytes, fallback: fallback, m: m, fetches: make(chan struct{}, maxFetches), stream: stream, lineage: l}
}

// errNotInStream says the stream cannot give an evaluation's content; ClickHouse can.
var errNotInStream = errors.New("not in the EVALUATIONS stream")

func (s *streamContent) get(ctx context.Context, key rank.TeamKey, from, before int, refs []rank.ContentRef) (*rank.Content, error) {
	c, err := s.read(ctx, key, refs)
	if err == nil {
		s.m.contentReads.WithLabelValues("stream").Inc()
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if !errors.Is(err, errNotInStream) {
		s.stream.forget() // reconfigured (direct gets turned off), recreated, or out of reach
	}
	s.m.contentReads.WithLabelValues("clickhouse").Inc()
	return s.fallback(ctx, key, from, before)
}

// read gets every ref's message at once and adds each evaluation to the content. The first
// failure cancels the other fetches (they would be thrown away, and they hold shared slots), and
// is the error returned: errNotInStream when the stream answered without the evaluation, another
// error when the stream itself failed (then the handle is looked up again; a later read that
// fails on the stream forgets it too, whichever error came first here).
func (s *streamContent) read(ctx context.Context, key rank.TeamKey, refs []rank.ContentRef) (*rank.Content, error) {
	era := s.lineage.eraNow()
	for _, ref := range refs {
		if ref.Era != era {
			return nil, fmt.Errorf("%w: %s is of era %d, the stream's is %d", errNotInStream, ref.EventID, ref.Era, era)
		}
	}
	st, err := s.stream.get(ctx)
	if err != nil {
		return nil, err
	}
	recs := make([]rank.Record, len(refs))
	g, gctx := errgroup.WithContext(ctx)
	for i, ref := range refs {
		g.Go(func() error {
			select {
			case s.fetches <- struct{}{}:
				defer func() { <-s.fetches }()
			case <-gctx.Done():
				return gctx.Err()
			}
			var err error
			recs[i], err = s.record(gctx, st, key, ref)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	c := rank.NewContent()
	for _, r := range recs {
		c.Add(r)
	}
	return c, nil
}

// record is the evaluation at ref's sequence, checked to be the one the score row names.
func (s *streamContent) record(ctx context.Context, st jetstream.Stream, key rank.TeamKey, ref rank.ContentRef) (rank.Record, error) {
	msg, err := st.GetMsg(ctx, ref.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rank.Record{}, fmt.Errorf("%w: sequence %d (%s)", errNotInStream, ref.Seq, ref.EventID)
	}
	if err != nil {
		return rank.Record{}, fmt.Errorf("EVALUATIONS sequence %d: %w", ref.Seq, err)
	}
	ev, err := events.ParseEvaluation(msg.Subject, msg.Data, s.maxBytes)
	if err != nil || ev.ID != ref.EventID || ev.Data.ExecutionID != key.ExecutionID || ev.Data.TeamID != key.TeamID {
		return rank.Record{}, fmt.Errorf("%w: sequence %d is not evaluation %s of %s/%s", errNotInStream, ref.Seq, ref.EventID, key.ExecutionID, key.TeamID)
	}
	return rank.RecordOf(ev, ref.Seq, ref.Era), nil
}
