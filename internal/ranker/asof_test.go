package ranker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
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
			calls := 0
			committed := func(context.Context) (uint64, uint64, error) { calls++; return tt.floor, tt.last, tt.err }
			a := waitCommitted(t.Context(), committed, tt.seq, 120*time.Millisecond)
			if (a == nil) != (tt.status == http.StatusOK) {
				t.Fatalf("waitCommitted = %+v, want committed %v", a, tt.status == http.StatusOK)
			}
			if a == nil {
				return
			}
			b, _ := json.Marshal(a.body)
			var body notCommitted
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
			if a.status != tt.status || body.Code != tt.code {
				t.Errorf("%d %s, want %d %s", a.status, b, tt.status, tt.code)
			}
			if tt.code == "not_committed" && (body.CommittedSeq != tt.floor || body.AsOf != tt.seq || !a.retryAfter || calls < 2) {
				t.Errorf("not_committed says %+v after %d reads (retry after: %v)", body, calls, a.retryAfter)
			}
		})
	}
	// A floor that reaches the sequence while the read waits: answered then.
	floor := uint64(5)
	if a := waitCommitted(t.Context(), func(context.Context) (uint64, uint64, error) { floor++; return floor, 20, nil }, 9, 10*time.Second); a != nil {
		t.Fatalf("a floor moving to 9 was not waited for: %+v", a)
	}
}
