// Package console is the read-only web console of a tournament: executions, each one's
// leaderboard, score chart and rounds x teams grid, a team's round with its prompt exactly as
// published, the diff against the previous round, its submission and feedback and a verify
// action, the template registry and the dead letters. Pages are server-rendered html/template
// (its contextual escaping is the defence against hostile model output: no team or evaluator
// text is ever marked safe), assets are embedded, and pages of a running execution follow it
// through one set of NATS subscriptions per process, fanned out as Server-Sent Events.
package console

import (
	"context"
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/internal/storeview"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/rank"
)

//go:embed web
var webFS embed.FS

// Store is what the console reads of ClickHouse (a *chstore.Store; a read-only user suffices):
// the ranker's evaluations through a view begun for each page (storeview.Store), the prompts
// archive directly.
type Store interface {
	storeview.Store
	TemplateExecutions(ctx context.Context, name string) ([]string, error)
	audit.Archive
}

// evaluations are a page's reads of the ranker's store: one anchored view of it (a
// *storeview.Read), begun before the page is built and checked again after.
type evaluations interface {
	Executions(ctx context.Context) ([]chstore.ExecutionSummary, error)
	Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
	Content(ctx context.Context, executionID, teamID string, fromRound, beforeRound int) (*rank.Content, error)
}

var _ Store = (*chstore.Store)(nil)

// Deps are what a console works with.
type Deps struct {
	Log   *slog.Logger
	Reg   prometheus.Registerer
	NC    *nats.Conn
	JS    jetstream.JetStream
	Store Store
	// Verify checks one record as `podium prompts verify` does: nil, an *audit.Mismatch, or an
	// error that is no verdict.
	Verify func(ctx context.Context, r audit.Record) error
	// Try renders recorded requests again with a template version (ref: name@V), publishing
	// nothing, as `podium templates try` does.
	Try func(ctx context.Context, ref string, recs []audit.Record) ([]audit.Trial, error)
	// Builtin are the templates composers load without the registry (built-in and
	// COMPOSER_TEMPLATES_DIR).
	Builtin []*compose.Template
	// MaxViewers bounds open live pages; CacheExecutions the executions whose grid is kept.
	MaxViewers, CacheExecutions int
}

// Console serves the pages.
type Console struct {
	d     Deps
	pages map[string]*template.Template
	grid  *gridIndex
	hub   *hub
	m     *metrics
}

type metrics struct {
	pageSeconds *prometheus.HistogramVec
	pageErrors  *prometheus.CounterVec
	viewers     prometheus.Gauge
	liveSent    prometheus.Counter
	streamReads *prometheus.CounterVec
	verifies    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := series.On(reg).Under("console")
	return &metrics{
		pageSeconds: f.HistogramVec("page_seconds", "Time to answer a page, by page.", []float64{.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, "page"),
		pageErrors:  f.CounterVec("page_errors_total", "Pages answered with an error because NATS or ClickHouse failed, by page.", "page"),
		viewers:     f.Gauge("live_viewers", "Open live pages (Server-Sent Events responses)."),
		liveSent:    f.Counter("live_notifications_total", "Update notifications handed to live pages (coalesced per page)."),
		streamReads: f.CounterVec("stream_messages_read_total", "Messages read from ROUNDS and PROMPTS to keep the grids of executions up to date, by stream.", "stream"),
		verifies:    f.CounterVec("verifications_total", "Verify actions, by verdict: ok, differs, error.", "verdict"),
	}
}

// New builds a console and subscribes its hub; Close undoes it.
func New(d Deps) (*Console, error) {
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	m := newMetrics(d.Reg)
	c := &Console{d: d, pages: pages, m: m,
		grid: newGridIndex(d.JS, max(d.CacheExecutions, 1), func(stream string, n int) { m.streamReads.WithLabelValues(stream).Add(float64(n)) }),
		hub:  newHub(max(d.MaxViewers, 1), func(n int) { m.viewers.Set(float64(n)) }, m.liveSent.Inc),
	}
	if err := c.hub.start(d.NC); err != nil {
		return nil, err
	}
	return c, nil
}

// Close ends every live response and the subscriptions.
func (c *Console) Close() { c.hub.stop() }

// audit reads prompt records: archived ones from ClickHouse, the stream's tail from PROMPTS.
func (c *Console) audit() audit.Source { return audit.Source{JS: c.d.JS, Archive: c.d.Store} }

// Handler serves every page, the assets and the live stream. Only GET and HEAD are answered.
func (c *Console) Handler() http.Handler {
	static, _ := fs.Sub(webFS, "web/static")
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /live", c.hub.serve)
	mux.HandleFunc("GET /{$}", c.page("executions", c.executions))
	mux.HandleFunc("GET /executions/{exec}", c.page("execution", c.execution))
	mux.HandleFunc("GET /executions/{exec}/teams/{team}/rounds/{round}", c.page("round", c.teamRound))
	mux.HandleFunc("GET /text/{kind}/{exec}/{team}/{round}", c.text)
	mux.HandleFunc("GET /templates", c.page("templates", c.templates))
	mux.HandleFunc("GET /templates/{name}", c.page("template", c.template))
	mux.HandleFunc("GET /deadletters", c.page("deadletters", c.deadletters))
	return secure(mux)
}

// Ready fails while the NATS connection is down.
func (c *Console) Ready(context.Context) error {
	if !c.d.NC.IsConnected() {
		return errNotConnected
	}
	return nil
}

// pageFunc builds a page's data from the request and the page's view of the store; an error is
// answered as the error page.
type pageFunc func(r *http.Request, ev evaluations) (any, error)

// page wraps a page's data function with the template, timing and the error page. A page is
// built only from a whole store: not while the ranker refills it, and not when a refill touched
// it while the page read it (internal/storeview); the error page says so instead.
func (c *Console) page(name string, data pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		defer func() { c.m.pageSeconds.WithLabelValues(name).Observe(time.Since(start).Seconds()) }()
		view, err := storeview.Begin(r.Context(), c.d.JS, c.d.Store)
		var v any
		if err == nil {
			v, err = data(r, view)
		}
		if err == nil {
			err = view.End(r.Context())
		}
		if err != nil {
			c.fail(w, r, name, err)
			return
		}
		c.render(w, name, http.StatusOK, v)
	}
}
