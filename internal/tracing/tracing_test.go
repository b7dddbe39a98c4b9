package tracing

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/pkg/events"
)

const (
	envParent    = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	headerParent = "00-11111111111111111111111111111111-2222222222222222-01"
)

func TestExtractAndInject(t *testing.T) {
	tr, err := Setup(context.Background(), "test", prometheus.NewRegistry(), nil) // no endpoint: a no-op tracer
	if err != nil {
		t.Fatal(err)
	}
	header := nats.Header{events.HeaderTraceParent: {headerParent}}
	tests := []struct {
		name      string
		env       events.TraceContext
		h         nats.Header
		wantTrace string // "" for no span context
		malformed float64
	}{
		{"envelope", events.TraceContext{Parent: envParent, State: "rojo=1"}, nil, "4bf92f3577b34da6a3ce929d0e0e4736", 0},
		{"the envelope wins over the header", events.TraceContext{Parent: envParent}, header, "4bf92f3577b34da6a3ce929d0e0e4736", 0},
		{"header only", events.TraceContext{}, header, "11111111111111111111111111111111", 0},
		{"a header named as another client sends it", events.TraceContext{}, nats.Header{"Traceparent": {headerParent}}, "11111111111111111111111111111111", 0},
		{"a header in capitals", events.TraceContext{}, nats.Header{"TRACEPARENT": {headerParent}}, "11111111111111111111111111111111", 0},
		{"none", events.TraceContext{}, nil, "", 0},
		{"malformed", events.TraceContext{Parent: "not-a-traceparent"}, nil, "", 1},
		{"all-zero ids", events.TraceContext{Parent: "00-00000000000000000000000000000000-0000000000000000-01"}, nil, "", 1},
		{"a malformed envelope is ignored: the header applies", events.TraceContext{Parent: "garbage"}, header, "11111111111111111111111111111111", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.ToFloat64(tr.malformed)
			ctx := tr.Extract(context.Background(), tt.env, tt.h)
			sc := trace.SpanContextFromContext(ctx)
			if got := map[bool]string{true: sc.TraceID().String(), false: ""}[sc.IsValid()]; got != tt.wantTrace {
				t.Errorf("trace id %q, want %q", got, tt.wantTrace)
			}
			if got := testutil.ToFloat64(tr.malformed) - before; got != tt.malformed {
				t.Errorf("malformed counted %v, want %v", got, tt.malformed)
			}
			// The no-op tracer's span hands the incoming context on unchanged.
			sctx, span := tr.Start(ctx, "child")
			defer span.End()
			out := tr.Inject(sctx)
			if tt.wantTrace == "" && out.Parent != "" || tt.wantTrace != "" && !strings.Contains(out.Parent, tt.wantTrace) {
				t.Errorf("injected %+v for trace %q", out, tt.wantTrace)
			}
		})
	}
}

func TestLogLinesCarryTheSpan(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil)))
	tr, _ := Setup(context.Background(), "test", prometheus.NewRegistry(), nil)
	ctx := tr.Extract(context.Background(), events.TraceContext{Parent: envParent}, nil)
	log.InfoContext(ctx, "inside")
	log.Info("outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !strings.Contains(lines[0], `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"`) || !strings.Contains(lines[0], `"span_id":"00f067aa0ba902b7"`) {
		t.Errorf("a line inside a span lacks its ids: %s", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("a line outside any span has a trace id: %s", lines[1])
	}
}

func TestUnknownProtocolIsRefused(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := Setup(context.Background(), "test", prometheus.NewRegistry(), nil); err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Errorf("Setup with http/json: %v, want an error naming OTEL_EXPORTER_OTLP_PROTOCOL", err)
	}
}

// TestNonStringTraceparentIsCounted: an envelope whose traceparent is not a string is accepted
// (never rejected for it) and the value is counted as malformed.
func TestNonStringTraceparentIsCounted(t *testing.T) {
	tr, _ := Setup(context.Background(), "test", prometheus.NewRegistry(), nil)
	body := `{"specversion":"1.0","id":"r1","source":"o","type":"round.requested","time":"2026-11-21T10:00:00Z","traceparent":42,` +
		`"data":{"execution_id":"e","team_id":"t","team_name":"T","round_number":1,"user_prompt":"Go."}}`
	req, err := events.ParseRoundRequest("round.requested.e.t", []byte(body), 1<<20)
	if err != nil {
		t.Fatalf("a non-string traceparent was refused: %v", err)
	}
	if sc := trace.SpanContextFromContext(tr.Extract(context.Background(), req.Trace, nil)); sc.IsValid() || testutil.ToFloat64(tr.malformed) != 1 {
		t.Errorf("traceparent 42: span context %v, malformed counted %v; want none and 1", sc, testutil.ToFloat64(tr.malformed))
	}
}
