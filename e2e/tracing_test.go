package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// exportedSpan is one span as an OTLP exporter sent it, ids in lower-case hex.
type exportedSpan struct {
	service                   string // service.name of the span's resource
	name                      string
	kind                      tracepb.Span_SpanKind
	traceID, spanID, parentID string // parentID is "" for a root
	traceState                string
	attrs                     map[string]any
	links                     []exportedLink
}

type exportedLink struct {
	traceID, spanID string
	attrs           map[string]any
}

func (s exportedSpan) String() string {
	return fmt.Sprintf("%s/%s[%s] trace %s span %s parent %q attrs %v links %d", s.service, s.name, s.kind, s.traceID, s.spanID, s.parentID, s.attrs, len(s.links))
}

// otlpReceiver is an OTLP/HTTP trace receiver (POST /v1/traces, protobuf, gzip or not) that
// keeps every span it is sent.
type otlpReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	spans    []exportedSpan
	requests int
}

func newOTLPReceiver(t testing.TB) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(r) // a free loopback port
	t.Cleanup(r.srv.Close)
	return r
}

// env is the configuration that points a service at the receiver.
func (r *otlpReceiver) env() []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.srv.URL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_TRACES_SAMPLER=parentbased_always_on",
	}
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "only POST /v1/traces", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if strings.EqualFold(req.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, "gzip: "+err.Error(), http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var ex coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &ex); err != nil {
		http.Error(w, "not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	var got []exportedSpan
	for _, rs := range ex.GetResourceSpans() {
		service, _ := attrMap(rs.GetResource().GetAttributes())["service.name"].(string)
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				es := exportedSpan{service: service, name: s.GetName(), kind: s.GetKind(),
					traceID: hex.EncodeToString(s.GetTraceId()), spanID: hex.EncodeToString(s.GetSpanId()),
					parentID: hex.EncodeToString(s.GetParentSpanId()), traceState: s.GetTraceState(), attrs: attrMap(s.GetAttributes())}
				for _, l := range s.GetLinks() {
					// (The SDK's OTLP exporter does not send a link's tracestate.)
					es.links = append(es.links, exportedLink{traceID: hex.EncodeToString(l.GetTraceId()), spanID: hex.EncodeToString(l.GetSpanId()),
						attrs: attrMap(l.GetAttributes())})
				}
				got = append(got, es)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.requests++
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
	w.Write(out)
}

func attrMap(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = anyValue(kv.GetValue())
	}
	return m
}

func anyValue(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, anyValue(e))
		}
		return out
	}
	return nil
}

func (r *otlpReceiver) snapshot() []exportedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// waitFor waits up to limit for the spans received to satisfy done, which says what is still
// missing ("" when nothing is), and fails the test with that when they do not.
func (r *otlpReceiver) waitFor(t testing.TB, limit time.Duration, done func([]exportedSpan) string) []exportedSpan {
	t.Helper()
	var spans []exportedSpan
	testenv.WaitFor(t, limit, "the receiver to get the spans", func() (bool, string) {
		spans = r.snapshot()
		missing := done(spans)
		if missing == "" {
			return true, ""
		}
		var all strings.Builder
		for _, s := range spans {
			fmt.Fprintf(&all, "  %s\n", s)
		}
		return false, fmt.Sprintf("it still lacks %s; it got %d spans:\n%s", missing, len(spans), &all)
	})
	return spans
}

// find returns the spans named name that match.
func find(spans []exportedSpan, name string, match func(exportedSpan) bool) []exportedSpan {
	var out []exportedSpan
	for _, s := range spans {
		if s.name == name && (match == nil || match(s)) {
			out = append(out, s)
		}
	}
	return out
}

// traceparent is a sampled W3C traceparent.
func traceparent(traceID, spanID string) string { return "00-" + traceID + "-" + spanID + "-01" }

// parseTraceparent splits a version-00 traceparent into its trace id and parent id.
func parseTraceparent(t testing.TB, what, v string) (traceID, parentID string) {
	t.Helper()
	p := strings.Split(v, "-")
	if len(p) != 4 || p[0] != "00" || len(p[1]) != 32 || len(p[2]) != 16 || len(p[3]) != 2 ||
		p[1] == strings.Repeat("0", 32) || p[2] == strings.Repeat("0", 16) {
		t.Fatalf("%s: traceparent %q is not valid W3C trace context", what, v)
	}
	return p[1], p[2]
}

// publishMsg publishes body with the usual headers plus extra ones, as an orchestrator would.
func (e *env) publishMsg(subject, id string, body []byte, header map[string]string) {
	e.t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", events.ContentType)
	msg.Header.Set(nats.MsgIdHdr, id)
	for k, v := range header {
		msg.Header[k] = []string{v} // as sent: W3C names are lower case
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, msg); err != nil {
		e.t.Fatalf("publish %s: %v", subject, err)
	}
}

func marshalTraced(t testing.TB, id, eventType string, at time.Time, data any, tc events.TraceContext) []byte {
	t.Helper()
	body, err := events.MarshalTraced(id, "orchestrator/test", eventType, at, data, tc)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// tracedPrompt is a prompt.composed read back with the trace context it carries.
type tracedPrompt struct {
	composed         events.PromptComposed
	envelopeParent   string // the envelope's traceparent
	headerParent     string // the traceparent header
	envelopeState    string // the envelope's tracestate
	headerState      string // the tracestate header
	subject, eventID string
}

// tracedPrompts reads n answers of filter from PROMPTS, checks each against the contract, and
// indexes them by request id.
func (e *env) tracedPrompts(filter string, n int, limit time.Duration) map[string]tracedPrompt {
	e.t.Helper()
	out := map[string]tracedPrompt{}
	for _, m := range e.collect(events.StreamPrompts, filter, n, limit) {
		if err := events.Validate(m.Subject, m.Body, 0); err != nil {
			e.t.Errorf("%s breaks the contract: %v\n%s", m.Subject, err, m.Body)
		}
		if !strings.HasPrefix(m.Subject, "prompt.composed.") {
			e.t.Fatalf("answer on %s, want prompt.composed: %s", m.Subject, m.Body)
		}
		var p tracedPrompt
		env := dataOf(e.t, m.Body, &p.composed)
		p.envelopeParent, p.envelopeState, p.subject, p.eventID = env.TraceParent, env.TraceState, m.Subject, env.ID
		p.headerParent, p.headerState = m.Header.Get(events.HeaderTraceParent), m.Header.Get(events.HeaderTraceState) // keys as sent: lower case
		out[p.composed.RequestID] = p
	}
	if len(out) != n {
		e.t.Fatalf("got answers to %d requests, want %d", len(out), n)
	}
	return out
}

// TestTraceFromOrchestratorToPrompt follows one trace: the orchestrator's evaluations (one with
// trace context in the envelope, one only in the NATS header) are linked from the ranker's
// batch span, whose leaderboard.updated continues the batch's trace; the orchestrator's round
// request is the parent of the composer's request span, whose children are the wait, the
// reads, the render and the publish, and whose context the prompt.composed event hands on.
func TestTraceFromOrchestratorToPrompt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rcv := newOTLPReceiver(t)
	// One batch for both evaluations, so one batch span links to both.
	e.start("ranker", append(rcv.env(), "RANKER_FLUSH_INTERVAL=1s", "RANKER_LINGER=1s")...) // one batch of both evaluations, whose span links to each
	composer := e.start("composer", rcv.env()...)

	const (
		exec      = "traced"
		traceID   = "0af7651916cd43dd8448eb211c80319c" // the orchestrator's trace
		requestSp = "b7ad6b7169203331"                 // its span that requests round 2
		evalSpA   = "00f067aa0ba902b7"                 // its spans that produced the evaluations
		evalSpB   = "53995c3f42cd8ad8"
		decoyTr   = "5c1f0c2bd7e94c1e9a1b2c3d4e5f6071" // a header the envelope must win over
		decoySp   = "1a2b3c4d5e6f7081"
	)
	evA := evaluation(exec, "team-alpha", "Alpha", 1, 72, "SUBMISSION OF alpha", t0)
	evB := evaluation(exec, "team-beta", "Beta", 1, 90, "SUBMISSION OF beta", t0.Add(time.Second))
	// Alpha's evaluation: trace context in the envelope only (with a tracestate).
	e.publishRaw(events.EvaluationSubject(exec, "team-alpha"), "ev-alpha-1",
		marshalTraced(t, "ev-alpha-1", events.TypeEvaluationCompleted, evA.EvaluatedAt, evA, events.TraceContext{Parent: traceparent(traceID, evalSpA), State: "orch=alpha"}))
	// Beta's evaluation: trace context in the NATS header only.
	e.publishMsg(events.EvaluationSubject(exec, "team-beta"), "ev-beta-1",
		marshalTraced(t, "ev-beta-1", events.TypeEvaluationCompleted, evB.EvaluatedAt, evB, events.TraceContext{}),
		map[string]string{events.HeaderTraceParent: traceparent(traceID, evalSpB)})
	// The round request: the orchestrator's span in the envelope, a decoy in the header.
	rr := events.RoundRequested{ExecutionID: exec, TeamID: "team-alpha", TeamName: "Alpha", RoundNumber: 2, UserPrompt: "Improve.", MaxRounds: 3}
	e.publishMsg(events.RoundSubject(exec, "team-alpha"), "req-alpha-2",
		marshalTraced(t, "req-alpha-2", events.TypeRoundRequested, t0.Add(time.Hour), rr, events.TraceContext{Parent: traceparent(traceID, requestSp), State: "orch=round2"}),
		map[string]string{events.HeaderTraceParent: traceparent(decoyTr, decoySp)})

	p := e.tracedPrompts("prompt.*."+exec+".team-alpha", 1, 30*time.Second)["req-alpha-2"]
	pc := p.composed
	if !strings.Contains(pc.Prompt, "SUBMISSION OF alpha") || pc.Inputs.EvaluationsSeq != 2 {
		t.Errorf("the prompt does not hold round 1 (evaluations_seq %d):\n%s", pc.Inputs.EvaluationsSeq, pc.Prompt)
	}
	lbs := e.collect(events.StreamLeaderboards, events.LeaderboardSubject(exec), 1, 10*time.Second)
	if len(lbs) != 1 {
		t.Fatalf("got %d leaderboard.updated, want 1", len(lbs))
	}
	if err := events.Validate(lbs[0].Subject, lbs[0].Body, 0); err != nil {
		t.Errorf("leaderboard.updated breaks the contract: %v\n%s", err, lbs[0].Body)
	}
	var lu leaderboard
	lbEnv := dataOf(t, lbs[0].Body, &lu)
	lbTrace, lbParent := parseTraceparent(t, "leaderboard.updated envelope", lbEnv.TraceParent)
	if h := lbs[0].Header.Get(events.HeaderTraceParent); h != lbEnv.TraceParent {
		t.Errorf("leaderboard.updated: traceparent header %q, envelope %q: want both the same", h, lbEnv.TraceParent)
	}

	// (c) The prompt hands on the request span's context, in the envelope and the header.
	promptTrace, promptParent := parseTraceparent(t, "prompt.composed envelope", p.envelopeParent)
	if p.headerParent != p.envelopeParent {
		t.Errorf("prompt.composed: traceparent header %q, envelope %q: want both the same", p.headerParent, p.envelopeParent)
	}
	if promptTrace != traceID {
		t.Errorf("prompt.composed continues trace %s, want the orchestrator's %s", promptTrace, traceID)
	}
	if p.envelopeState != "orch=round2" || p.headerState != "orch=round2" {
		t.Errorf("prompt.composed tracestate: envelope %q, header %q; want the request's orch=round2 in both", p.envelopeState, p.headerState)
	}

	isRequest := func(s exportedSpan) bool { return s.attrs["podium.request_id"] == "req-alpha-2" }
	// linkingCommit is the batch span that links to both evaluations' span contexts, each link
	// naming its evaluation.
	wantLinks := map[string]string{evalSpA: "ev-alpha-1", evalSpB: "ev-beta-1"}
	linkingCommit := func(spans []exportedSpan) *exportedSpan {
		for _, c := range find(spans, "ranker.commit", nil) {
			n := 0
			for _, l := range c.links {
				if id, ok := wantLinks[l.spanID]; ok && l.traceID == traceID && l.attrs["podium.evaluation_id"] == id {
					n++
				}
			}
			if n == len(wantLinks) {
				return &c
			}
		}
		return nil
	}
	children := []string{"composer.inputs_wait", "composer.read_scores", "composer.read_content", "composer.render", "composer.publish"}
	spans := rcv.waitFor(t, 10*time.Second, func(spans []exportedSpan) string {
		req := find(spans, "composer.request", isRequest)
		if len(req) == 0 {
			return "composer.request of req-alpha-2"
		}
		for _, name := range children {
			if len(find(spans, name, func(s exportedSpan) bool { return s.parentID == req[0].spanID })) == 0 {
				return name + " under composer.request"
			}
		}
		if len(find(spans, "ranker.announce", func(s exportedSpan) bool { return s.spanID == lbParent })) == 0 {
			return "the ranker.announce span " + lbParent + " that leaderboard.updated names"
		}
		c := linkingCommit(spans)
		if c == nil {
			return "a ranker.commit span linking both evaluations"
		}
		if len(find(spans, "clickhouse.insert", func(s exportedSpan) bool { return s.parentID == c.spanID })) == 0 {
			return "clickhouse.insert under ranker.commit " + c.spanID
		}
		return ""
	})

	// (a) The request span: a child of the orchestrator's span (the envelope won over the header).
	reqs := find(spans, "composer.request", isRequest)
	if len(reqs) != 1 {
		t.Fatalf("%d composer.request spans of req-alpha-2, want 1: %v", len(reqs), reqs)
	}
	req := reqs[0]
	if req.traceID != traceID || req.parentID != requestSp {
		t.Errorf("composer.request is in trace %s under %s, want trace %s under the orchestrator's span %s (not the header's %s/%s)",
			req.traceID, req.parentID, traceID, requestSp, decoyTr, decoySp)
	}
	if req.service != "composer" || req.kind != tracepb.Span_SPAN_KIND_CONSUMER || req.traceState != "orch=round2" {
		t.Errorf("composer.request: service %q kind %s tracestate %q, want composer, consumer, the request's orch=round2", req.service, req.kind, req.traceState)
	}
	template := fmt.Sprintf("%s@%d", pc.Template.Name, pc.Template.Version)
	if template != "team-round@4" {
		t.Errorf("the prompt used %s, want team-round@4", template)
	}
	wantAttrs := map[string]any{
		"podium.execution_id":   exec,
		"podium.team_id":        "team-alpha",
		"podium.round_number":   int64(2),
		"podium.template":       template,
		"podium.token_estimate": int64(pc.TokenEstimate),
		"podium.token_encoding": pc.TokenEncoding,
		"podium.truncations":    int64(len(pc.Truncated)),
	}
	for k, want := range wantAttrs {
		if got := req.attrs[k]; got != want {
			t.Errorf("composer.request %s = %#v, want %#v", k, got, want)
		}
	}
	if _, failed := req.attrs["podium.failure_code"]; failed {
		t.Errorf("composer.request of a composed prompt has podium.failure_code %v", req.attrs["podium.failure_code"])
	}

	// (b) Its children, in the same trace.
	for _, name := range children {
		got := find(spans, name, func(s exportedSpan) bool { return s.parentID == req.spanID })
		if len(got) != 1 {
			t.Errorf("%d %s spans under composer.request, want 1", len(got), name)
			continue
		}
		if got[0].traceID != traceID || got[0].service != "composer" {
			t.Errorf("%s: trace %s service %q, want trace %s of composer", name, got[0].traceID, got[0].service, traceID)
		}
	}
	if w := find(spans, "composer.inputs_wait", func(s exportedSpan) bool { return s.parentID == req.spanID }); len(w) == 1 &&
		w[0].attrs["podium.evaluations_seq"] != int64(pc.Inputs.EvaluationsSeq) {
		t.Errorf("composer.inputs_wait podium.evaluations_seq = %#v, want %d", w[0].attrs["podium.evaluations_seq"], pc.Inputs.EvaluationsSeq)
	}
	if r := find(spans, "composer.render", func(s exportedSpan) bool { return s.parentID == req.spanID }); len(r) == 1 {
		for _, k := range []string{"podium.template", "podium.token_estimate", "podium.token_encoding", "podium.truncations"} {
			if r[0].attrs[k] != wantAttrs[k] {
				t.Errorf("composer.render %s = %#v, want %#v", k, r[0].attrs[k], wantAttrs[k])
			}
		}
	}
	// (c) The event names the request span as its parent.
	if promptParent != req.spanID {
		t.Errorf("prompt.composed names parent %s, want composer.request's span %s", promptParent, req.spanID)
	}

	// (d) One batch span links to both evaluations, the header-only one too, with the insert under it.
	commit := linkingCommit(spans)
	if commit == nil {
		t.Fatalf("no ranker.commit span links to both evaluations (%s/%s as ev-alpha-1, %s/%s as ev-beta-1): %v",
			traceID, evalSpA, traceID, evalSpB, find(spans, "ranker.commit", nil))
	}
	if commit.service != "ranker" || commit.kind != tracepb.Span_SPAN_KIND_CONSUMER || commit.parentID != "" ||
		commit.attrs["podium.batch_size"] != int64(2) {
		t.Errorf("ranker.commit: %s; want a root consumer span of ranker with podium.batch_size 2", commit)
	}
	if ins := find(spans, "clickhouse.insert", func(s exportedSpan) bool { return s.parentID == commit.spanID }); len(ins) != 1 || ins[0].traceID != commit.traceID {
		t.Errorf("clickhouse.insert under the batch span: %v, want one in trace %s", ins, commit.traceID)
	}

	// (e) leaderboard.updated continues the batch's trace, through ranker.announce.
	if lbTrace != commit.traceID {
		t.Errorf("leaderboard.updated is in trace %s, want the batch span's %s", lbTrace, commit.traceID)
	}
	ann := find(spans, "ranker.announce", func(s exportedSpan) bool { return s.spanID == lbParent })
	if len(ann) != 1 || ann[0].parentID != commit.spanID || ann[0].traceID != commit.traceID || ann[0].service != "ranker" {
		t.Errorf("ranker.announce %s named by leaderboard.updated: %v, want one child of ranker.commit %s", lbParent, ann, commit.spanID)
	}

	// (f) The render latency histogram carries the sampled request's trace id as an exemplar
	// (OpenMetrics, what Prometheus asks for when it stores exemplars).
	scrape, _ := http.NewRequest(http.MethodGet, "http://"+composer.addr+"/metrics", nil)
	scrape.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(scrape)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var exemplar bool
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "composer_render_duration_seconds_bucket") && strings.Contains(line, `# {trace_id="`+traceID+`"}`) {
			exemplar = true
		}
	}
	if !exemplar {
		t.Errorf("no composer_render_duration_seconds bucket has the exemplar trace_id %s", traceID)
	}
}

// TestTraceOfRenderRequests: POST /v1/render and podium.render are request spans too, children
// of the caller's traceparent header, with the compose children under them.
func TestTraceOfRenderRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker") // the store's tables; no evaluation is published, so nothing to wait for
	rcv := newOTLPReceiver(t)
	composer := e.start("composer", rcv.env()...)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const httpSpan, natsSpan = "00f067aa0ba902b7", "a3ce929d0e0e4736"
	body := `{"execution_id":"rt","team_id":"t1","team_name":"One","round_number":1,"user_prompt":"Go.","request_id":"r1","time":"2026-11-21T11:00:00Z"}`

	status, out := composer.renderTraced(t, json.RawMessage(body), traceparent(traceID, httpSpan))
	if status != http.StatusOK {
		t.Fatalf("POST /v1/render: %d %s", status, out)
	}
	msg := nats.NewMsg("podium.render")
	msg.Data = []byte(body)
	msg.Header[events.HeaderTraceParent] = []string{traceparent(traceID, natsSpan)}
	answer, err := e.nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatalf("podium.render: %v", err)
	}
	if !bytes.Equal(answer.Data, out) {
		t.Errorf("podium.render answered %s, POST /v1/render %s", answer.Data, out)
	}

	children := []string{"composer.inputs_wait", "composer.read_scores", "composer.render"}
	spans := rcv.waitFor(t, 10*time.Second, func(spans []exportedSpan) string {
		for _, parent := range []string{httpSpan, natsSpan} {
			rr := find(spans, "composer.render_request", func(s exportedSpan) bool { return s.parentID == parent })
			if len(rr) == 0 {
				return "composer.render_request under " + parent
			}
			for _, name := range children {
				if len(find(spans, name, func(s exportedSpan) bool { return s.parentID == rr[0].spanID })) == 0 {
					return name + " under the composer.render_request of " + parent
				}
			}
		}
		return ""
	})
	for _, parent := range []string{httpSpan, natsSpan} {
		rr := find(spans, "composer.render_request", func(s exportedSpan) bool { return s.parentID == parent })
		if len(rr) != 1 || rr[0].traceID != traceID || rr[0].kind != tracepb.Span_SPAN_KIND_SERVER ||
			rr[0].attrs["podium.execution_id"] != "rt" || rr[0].attrs["podium.template"] != "team-round@4" {
			t.Errorf("composer.render_request under %s: %v; want one server span in trace %s of execution rt, template team-round@4", parent, rr, traceID)
		}
	}
}

// TestMalformedTraceparentIsIgnored: a traceparent that is not W3C trace context, or names the
// invalid all-zero ids, is counted and ignored: the request is answered, its span the root of a
// new trace that the prompt hands on.
func TestMalformedTraceparentIsIgnored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker") // the store's tables; no evaluation is published, so nothing to wait for
	rcv := newOTLPReceiver(t)
	composer := e.start("composer", rcv.env()...)
	bad := map[string]string{
		"req-garbage": "not-a-traceparent",
		"req-zeros":   "00-00000000000000000000000000000000-0000000000000000-01",
	}
	teams := map[string]string{"req-garbage": "t1", "req-zeros": "t2"}
	for id, tp := range bad {
		rr := events.RoundRequested{ExecutionID: "mal", TeamID: teams[id], TeamName: "Team " + teams[id], RoundNumber: 1, UserPrompt: "Go."}
		e.publishRaw(events.RoundSubject("mal", teams[id]), id,
			marshalTraced(t, id, events.TypeRoundRequested, t0, rr, events.TraceContext{Parent: tp}))
	}
	got := e.tracedPrompts("prompt.*.mal.*", 2, 30*time.Second)
	waitMetric(t, composer, "composer_trace_context_malformed_total", 2)

	spans := rcv.waitFor(t, 10*time.Second, func(spans []exportedSpan) string {
		for id := range bad {
			if len(find(spans, "composer.request", func(s exportedSpan) bool { return s.attrs["podium.request_id"] == id })) == 0 {
				return "composer.request of " + id
			}
		}
		return ""
	})
	traces := map[string]bool{}
	for id, tp := range bad {
		reqs := find(spans, "composer.request", func(s exportedSpan) bool { return s.attrs["podium.request_id"] == id })
		if len(reqs) != 1 {
			t.Errorf("%s: %d composer.request spans, want 1", id, len(reqs))
			continue
		}
		s := reqs[0]
		if s.parentID != "" || len(s.traceID) != 32 || s.traceID == strings.Repeat("0", 32) || strings.Contains(tp, s.traceID) {
			t.Errorf("%s (traceparent %q): composer.request %s, want the root of a new trace", id, tp, s)
		}
		traces[s.traceID] = true
		p := got[id]
		pt, pp := parseTraceparent(t, id+" prompt.composed envelope", p.envelopeParent)
		if pt != s.traceID || pp != s.spanID || p.headerParent != p.envelopeParent {
			t.Errorf("%s: prompt.composed traceparent %q (header %q), want the new trace %s under span %s", id, p.envelopeParent, p.headerParent, s.traceID, s.spanID)
		}
	}
	if len(traces) != len(bad) {
		t.Errorf("the two requests share a trace: %v", traces)
	}
}

// TestExportFailureNeverDelaysAPrompt: with the collector down, every request is answered all
// the same and a render with a traceparent answers 200.
func TestExportFailureNeverDelaysAPrompt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")   // the store's tables; no evaluation is published, so nothing to wait for
	down := freeAddr(t) // nothing listens there
	composer := e.start("composer", "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+down, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_TRACES_SAMPLER=parentbased_always_on")
	const n = 20
	start := time.Now()
	for i := range n {
		team := fmt.Sprintf("t%02d", i)
		id := "req-" + team
		rr := events.RoundRequested{ExecutionID: "down", TeamID: team, TeamName: "Team " + team, RoundNumber: 1, UserPrompt: "Go."}
		tp := traceparent(fmt.Sprintf("%032x", 0xabc000+i), fmt.Sprintf("%016x", 0xdef000+i)) // sampled: spans must be exported
		e.publishRaw(events.RoundSubject("down", team), id, marshalTraced(t, id, events.TypeRoundRequested, t0, rr, events.TraceContext{Parent: tp}))
	}
	got := e.answers("prompt.*.down.*", n, 60*time.Second)
	for i := range n {
		id := fmt.Sprintf("req-t%02d", i)
		if a := got[id]; !a.ok() {
			t.Errorf("%s: %s %+v, want prompt.composed", id, a.subject, a.failed)
		}
	}
	t.Logf("%d prompts answered in %s with the collector down", n, time.Since(start).Round(time.Millisecond))
	// The spans of those requests were sampled: the exporter did try, and fail, meanwhile. The
	// failure is counted and logged as a JSON line of the service's log, never as plain text.
	for deadline := time.Now().Add(5 * time.Second); composer.metric(t, "composer_trace_export_errors_total") == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("no failed trace export counted: the test did not exercise a collector that is down")
			break
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(composer.logs.String()), "\n") {
		if !strings.HasPrefix(line, "{") {
			t.Errorf("a log line that is not JSON: %q", line)
		} else if strings.Contains(line, "trace export failed") && !strings.Contains(line, `"level":"WARN"`) {
			t.Errorf("the export failure is not a warning: %s", line)
		}
	}

	status, out := composer.renderTraced(t, json.RawMessage(`{"execution_id":"down","team_id":"t00","team_name":"Team t00","round_number":1,"user_prompt":"Go."}`),
		traceparent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
	if status != http.StatusOK {
		t.Errorf("POST /v1/render with the collector down: %d %s", status, out)
	}
	if v := composer.metric(t, "composer_trace_context_malformed_total"); v != 0 {
		t.Errorf("composer_trace_context_malformed_total = %v, want 0 (every traceparent was valid)", v)
	}
}
