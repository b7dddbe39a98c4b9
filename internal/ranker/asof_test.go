package ranker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestWaitCommitted: the decisions of a read as of a sequence, over the floor and last sequence a
// server would report (the e2e TestBoardAsOfMySequence reads them from a real one).
func TestWaitCommitted(t *testing.T) {
	tests := []struct {
		name        string
		floor, last uint64
		err         error
		seq         uint64
		status      int
		code        string
	}{
		{"committed", 10, 12, nil, 10, http.StatusOK, ""},
		{"not yet", 7, 12, nil, 10, http.StatusServiceUnavailable, "not_committed"},
		{"beyond the stream", 12, 12, nil, 13, http.StatusConflict, "as_of_unknown"},
		{"floor unreadable", 0, 0, errors.New("no responders"), 10, http.StatusServiceUnavailable, "nats_unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			calls := 0
			committed := func(context.Context) (uint64, uint64, error) { calls++; return tt.floor, tt.last, tt.err }
			ok := waitCommitted(t.Context(), w, committed, tt.seq, 120*time.Millisecond)
			if ok != (tt.status == http.StatusOK) {
				t.Fatalf("waitCommitted = %v, want %v", ok, tt.status == http.StatusOK)
			}
			if ok {
				return
			}
			var body notCommitted
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if w.Code != tt.status || body.Code != tt.code {
				t.Errorf("%d %s, want %d %s", w.Code, w.Body, tt.status, tt.code)
			}
			if tt.code == "not_committed" && (body.CommittedSeq != tt.floor || body.AsOf != tt.seq || w.Header().Get("Retry-After") == "" || calls < 2) {
				t.Errorf("not_committed says %+v after %d reads (Retry-After %q)", body, calls, w.Header().Get("Retry-After"))
			}
		})
	}
	// A floor that reaches the sequence while the read waits: answered then.
	floor := uint64(5)
	w := httptest.NewRecorder()
	if !waitCommitted(t.Context(), w, func(context.Context) (uint64, uint64, error) { floor++; return floor, 20, nil }, 9, 10*time.Second) {
		t.Fatalf("a floor moving to 9 was not waited for: %d %s", w.Code, w.Body)
	}
}
