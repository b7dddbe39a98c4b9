// Package inputs is how the composer gets what a prompt is made of, all in one place: the
// read-your-writes wait on the commit probe (wait.go, probe.go), the scores of executions shared
// between requests and kept briefly (scores.go), and each team's own content from the
// EVALUATIONS stream with ClickHouse as the fallback (content.go). Every read that several
// requests may share goes through the one batcher (batcher.go); fan-out is an errgroup; no lock
// is held across I/O; time comes from an injected clock.
package inputs

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/rank"
)

// Clock is the time the reads see: when a kept read expires, how long the wait pauses.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Store is what the inputs read of ClickHouse (a *chstore.Store).
type Store interface {
	Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
	Contents(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int) (map[rank.TeamKey]*rank.Content, error)
}

var _ Store = (*chstore.Store)(nil)

// Deps are what the inputs read from and report to.
type Deps struct {
	NC       *nats.Conn // nil: no commit notices, the wait polls
	JS       jetstream.JetStream
	Store    Store
	Trace    *tracing.Tracing
	Reg      prometheus.Registerer
	Clock    Clock         // nil: the wall clock
	Timeout  time.Duration // COMPOSER_INPUTS_TIMEOUT: the longest read-your-writes wait
	CacheTTL time.Duration // COMPOSER_READ_CACHE_TTL: how long a scores read serves later requests
	MaxBytes int           // MAX_EVENT_BYTES, to parse evaluations read from the stream
	// StoreLineage reads the store's lineage (chstore.Store.Lineage), for a ranker that published
	// none (wait.go: eraOf); nil: era 0 then.
	StoreLineage func(ctx context.Context) (chstore.Lineage, bool, error)
	// Anchored is Store's reads anchored on a row (chstore.Store.Anchored, gate.go); nil: reads
	// are not anchored.
	Anchored func(chstore.RowKey) Store
}

// Metrics are the composer's series of its reads; the names are stable (dashboards use them).
type Metrics struct {
	storeRead    prometheus.Histogram
	storeReads   *prometheus.CounterVec
	contentRead  prometheus.Histogram
	contentReads *prometheus.CounterVec
	requestReads *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *Metrics {
	f := series.On(reg)
	return &Metrics{
		storeRead:    f.Histogram("composer_store_read_duration_seconds", "Time of one ClickHouse read of the scores of one or more executions (leaderboard and rounds of every team).", series.Doubling(0.0001, 16)),
		contentRead:  f.Histogram("composer_content_read_duration_seconds", "Time of one ClickHouse read of teams' own submissions and feedback (one query serves the teams that asked meanwhile), of the rounds their templates print: the fallback when the EVALUATIONS stream cannot give them.", series.Doubling(0.0001, 16)),
		contentReads: f.CounterVec("composer_content_reads_total", "Where each request's own content came from: stream (EVALUATIONS messages by sequence) or clickhouse (the stream no longer held one of them).", "source"),
		requestReads: f.HistogramVec("composer_request_read_seconds", "Time one request spent getting its inputs, by read: scores (shared, kept or queried) and content (stream direct gets, or the ClickHouse fallback).", series.Doubling(0.0001, 16), "read"),
		storeReads:   f.CounterVec("composer_store_reads_total", "How each request got its inputs: queried (a ClickHouse read started for it), snapshot (the ranker's score snapshot, complete through its sequence), shared (joined a read of its execution) or cached (a kept read covering its sequence).", "result"),
	}
}

// Inputs are the composer's reads.
type Inputs struct {
	lineage  *lineage
	failing  atomic.Pointer[readFailure] // the last store read's failure, while reads fail
	probes   *probes
	scores   *storeReads
	contents *streamContent
	commits  *commits
	m        *Metrics
	trace    *tracing.Tracing
	clock    Clock
	timeout  time.Duration
	// storeLineage is Deps.StoreLineage.
	storeLineage func(ctx context.Context) (chstore.Lineage, bool, error)
}

// New builds the reads of one composer and listens for the ranker's commit notices.
func New(d Deps) (*Inputs, error) {
	clock := d.Clock
	if clock == nil {
		clock = realClock{}
	}
	m := newMetrics(d.Reg)
	// One EVALUATIONS handle for the snapshots' direct gets and the content's: one lookup, and a
	// failure seen by either makes both look it up again.
	evaluations := &evaluationsStream{js: d.JS}
	lin := &lineage{}
	// A probe is two JetStream API calls (milliseconds); one caught by a disconnect must not
	// hold every waiting request for long, since probes run one at a time.
	probes := newProbes(d.JS, clock.Now, 2*time.Second, lin)
	store := gate{store: d.Store, anchored: d.Anchored, probes: probes, l: lin, now: clock.Now}
	scores := newStoreReads(store.Scores, d.CacheTTL, maxKeptBytes, m, clock.Now)
	lin.changed = scores.forget
	scores.snaps = newSnapshots(d.JS, evaluations, clock, lin)
	in := &Inputs{
		lineage:  lin,
		probes:   probes,
		scores:   scores,
		contents: newStreamContent(d.JS, evaluations, lin, d.MaxBytes, newContentReads(store.Contents, m).get, m),
		commits:  newCommits(),
		m:        m,
		trace:    d.Trace,
		clock:    clock,
		timeout:  d.Timeout,

		storeLineage: d.StoreLineage,
	}
	if d.NC != nil {
		if _, err := in.commits.listen(d.NC); err != nil {
			return nil, fmt.Errorf("inputs: listen for commits: %w", err)
		}
	}
	return in, nil
}

// Ready fails while no prompt can be composed from whole inputs: the ranker refills its store (as
// the last commit probe read it), or the store's reads fail (until one succeeds, or for
// failingFor). A composer that
// answers every request inputs_not_ready or store_unavailable is not ready, whatever else works.
func (in *Inputs) Ready(ctx context.Context) error {
	if in.lineage.refill() != "" {
		// Probes run for waiting requests: with none, look again, or the refill's end is not seen.
		_, _ = in.probes.join(ctx)
	}
	if why := in.lineage.refill(); why != "" {
		return fmt.Errorf("the ranker refills its store from EVALUATIONS (%s)", why)
	}
	if f := in.failing.Load(); f != nil && in.clock.Now().Sub(f.at) < failingFor {
		return fmt.Errorf("store reads fail: %s", f.why)
	}
	return nil
}

// readFailure is a store read that failed, and when.
type readFailure struct {
	why string
	at  time.Time
}

// failingFor is how long a failed store read keeps the composer unready without a read that
// succeeds: no request may come to try again, and a failure long past says nothing of now.
const failingFor = 10 * time.Second

// noteRead records how a store read ended; one that its caller abandoned says nothing.
func (in *Inputs) noteRead(ctx context.Context, err error) {
	switch {
	case err == nil:
		in.failing.Store(nil)
	case ctx.Err() == nil:
		in.failing.Store(&readFailure{why: err.Error(), at: in.clock.Now()})
	}
}

// Reader reads a prompt's inputs through the shared reads, each read a span of the request's.
func (in *Inputs) Reader() render.Reader { return reader{in} }

type reader struct{ in *Inputs }

func (r reader) Scores(ctx context.Context, executionID string, pos rank.Pos) (*rank.Evaluations, error) {
	ctx, span := r.in.trace.Start(ctx, "composer.read_scores", trace.WithAttributes(attribute.String("podium.execution_id", executionID),
		attribute.Int64("podium.evaluations_seq", int64(pos.Seq)), attribute.Int64("podium.evaluations_era", int64(pos.Era))))
	start := time.Now()
	evs, err := r.in.scores.get(ctx, executionID, pos)
	tracing.Observe(ctx, r.in.m.requestReads.WithLabelValues("scores"), time.Since(start).Seconds())
	tracing.End(span, err)
	r.in.noteRead(ctx, err)
	return evs, err
}

func (r reader) Content(ctx context.Context, key rank.TeamKey, from, before int, refs []rank.ContentRef) (*rank.Content, error) {
	ctx, span := r.in.trace.Start(ctx, "composer.read_content", trace.WithAttributes(attribute.Int("podium.evaluations", len(refs)),
		attribute.Int("podium.from_round", from)))
	start := time.Now()
	c, err := r.in.contents.get(ctx, key, from, before, refs)
	tracing.Observe(ctx, r.in.m.requestReads.WithLabelValues("content"), time.Since(start).Seconds())
	tracing.End(span, err)
	r.in.noteRead(ctx, err)
	return c, err
}
