package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podium-llm/podium/internal/health"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func readyz(t *testing.T, h *health.Health) (int, map[string]string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.Handler(writeJSON)(rec, httptest.NewRequest("GET", "/readyz", nil))
	var body struct {
		Status  string            `json:"status"`
		Failing map[string]string `json:"failing"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("/readyz body %q: %v", rec.Body, err)
	}
	return rec.Code, body.Failing
}

func TestConditionsMakeReadiness(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := health.New(reg, "svc")
	writes := h.Condition("clickhouse", nil)
	fill := h.Condition("store", errors.New("not checked yet"))
	pingErr := error(nil)
	h.Probe("ping", func(context.Context) error { return pingErr })

	code, failing := readyz(t, h)
	if code != http.StatusServiceUnavailable || len(failing) != 1 || failing["store"] != "not checked yet" {
		t.Fatalf("/readyz = %d %v, want 503 naming store alone", code, failing)
	}
	fill.Holds()
	if code, failing := readyz(t, h); code != http.StatusOK || len(failing) != 0 {
		t.Fatalf("/readyz = %d %v, want 200", code, failing)
	}
	ready := "# HELP svc_ready 1 when the service is ready (every condition of /readyz holds), else 0.\n# TYPE svc_ready gauge\nsvc_ready 1\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(ready), "svc_ready"); err != nil {
		t.Error(err)
	}

	writes.Fail("inserts are failing: %s", "no disk space left")
	pingErr = errors.New("connection refused")
	code, failing = readyz(t, h)
	if code != http.StatusServiceUnavailable || failing["clickhouse"] != "inserts are failing: no disk space left" || failing["ping"] != "connection refused" || len(failing) != 2 {
		t.Fatalf("/readyz = %d %v, want 503 naming clickhouse and ping", code, failing)
	}
	want := `
# HELP svc_ready_condition 1 while the named readiness condition holds, else 0 (/readyz says why).
# TYPE svc_ready_condition gauge
svc_ready_condition{condition="clickhouse"} 0
svc_ready_condition{condition="ping"} 0
svc_ready_condition{condition="store"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "svc_ready_condition"); err != nil {
		t.Error(err)
	}
	if err := h.Ready(context.Background()); err == nil || err.Error() != "clickhouse: inserts are failing: no disk space left\nping: connection refused" {
		t.Errorf("Ready = %v, want both named in order", err)
	}
	if was := writes.Holds(); !was {
		t.Error("Holds did not report the condition was failing")
	}
}

func TestFatalStays(t *testing.T) {
	h := health.New(prometheus.NewRegistry(), "svc")
	c := h.Condition("clickhouse", nil)
	c.Fatal(errors.New("stopped: the table refuses every row"))
	c.Holds()
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("after Fatal and Holds the condition is %v, want the fatal fault", err)
	}
}

func TestANameHasOneOwner(t *testing.T) {
	h := health.New(prometheus.NewRegistry(), "svc")
	h.Condition("store", nil)
	defer func() {
		if recover() == nil {
			t.Error("a second owner of one condition was accepted")
		}
	}()
	h.Probe("store", func(context.Context) error { return nil })
}
