package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/pkg/events"
)

// naks counts, per ROUNDS sequence, the composer's naks of a request as the server reports them
// (its MSG_NAKED advisories): an oracle outside the composer of how often a request was delivered
// before its answer (deliveries = naks + 1, since nothing else redelivers it here).
type naks struct {
	mu  sync.Mutex
	seq map[uint64]int
}

func watchNaks(t *testing.T, nc *nats.Conn) *naks {
	t.Helper()
	n := &naks{seq: map[uint64]int{}}
	sub, err := nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED."+events.StreamRounds+"."+events.ConsumerComposer, func(m *nats.Msg) {
		var adv struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		if err := json.Unmarshal(m.Data, &adv); err != nil {
			t.Errorf("a nak advisory: %v: %s", err, m.Data)
			return
		}
		n.mu.Lock()
		n.seq[adv.StreamSeq]++
		n.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *naks) deliveries(seq uint64) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.seq[seq] + 1
}

// TestDeliveriesBeforeEachFailure pins, for every failure code, how many deliveries of a request
// come before its prompt.failed (docs/contract.md#promptfailed): a retryable failure
// (inputs_not_ready, store_unavailable) only on the last of COMPOSER_MAX_DELIVER, every other at
// the first.
func TestDeliveriesBeforeEachFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const maxDeliver = 3
	if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "needs-vars.mustache"), []byte("Task {{vars.task.title}} for {{team.name}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	naked := watchNaks(t, e.nc)
	e.start("composer", "COMPOSER_TEMPLATES_DIR="+dir, fmt.Sprintf("COMPOSER_MAX_DELIVER=%d", maxDeliver),
		"COMPOSER_INPUTS_TIMEOUT=500ms", "COMPOSER_READ_CACHE_TTL=0")
	e.publishEvaluation("dl-ev-1", evaluation("dl", "t1", "One", 1, 50, "first", t0))
	base := events.RoundRequested{ExecutionID: "dl", TeamID: "t1", TeamName: "One", RoundNumber: 2, UserPrompt: "Go."}
	request := func(id string, rr events.RoundRequested) uint64 {
		return e.publish(events.RoundSubject(rr.ExecutionID, rr.TeamID), id, events.TypeRoundRequested, t0.Add(time.Hour), rr)
	}
	answered := 0
	// also: other codes the answer may carry (a race the test does not control decides which).
	check := func(id string, seq uint64, code events.FailureCode, retryable bool, also ...events.FailureCode) {
		t.Helper()
		answered++
		a := e.answers("prompt.*.dl.t1", answered, 60*time.Second)[id]
		want := 1
		if retryable {
			want = maxDeliver
		}
		if a.ok() || (a.failed.Code != code && !slices.Contains(also, a.failed.Code)) || a.failed.Retryable != retryable {
			t.Errorf("%s: %s %+v, want %s (retryable %v)", id, a.subject, a.failed, code, retryable)
		}
		if got := naked.deliveries(seq); got != want {
			t.Errorf("%s: %s after %d deliveries, want %d", id, code, got, want)
		}
	}

	// No ranker commits: every delivery waits out COMPOSER_INPUTS_TIMEOUT.
	check("req-inputs", request("req-inputs", base), events.CodeInputsNotReady, true)

	e.start("ranker")
	waitCommitted(t, e, 1)
	tiny := 20
	for _, c := range []struct {
		id     string
		mutate func(*events.RoundRequested)
		code   events.FailureCode
	}{
		{"req-tz", func(r *events.RoundRequested) { r.Timezone = "Mars/Olympus" }, events.CodeInvalidRequest},
		{"req-unknown", func(r *events.RoundRequested) { r.Template = "team-round@99" }, events.CodeUnknownTemplate},
		{"req-vars", func(r *events.RoundRequested) { r.Template = "needs-vars" }, events.CodeTemplateError},
		{"req-budget", func(r *events.RoundRequested) { r.Limits.MaxPromptTokens = &tiny }, events.CodeBudgetExceeded},
	} {
		rr := base
		c.mutate(&rr)
		check(c.id, request(c.id, rr), c.code, false)
	}
	// Not even JSON: answered under the id its stream position gives it, and dead-lettered.
	seq := e.publishRaw(events.RoundSubject("dl", "t1"), "req-broken", []byte(`{"not json`))
	check(fmt.Sprintf("%s-%d", events.StreamRounds, seq), seq, events.CodeInvalidRequest, false)

	// ClickHouse answering errors on every delivery.
	e.storeExec("RENAME TABLE evaluations TO evaluations_away")
	e.dropSnapshot("dl")
	// Whether the composer's read meets the missing table first, or the ranker's store check does
	// (and the ranker, refilling, commits nothing), the request fails retryably on every delivery.
	check("req-store", request("req-store", base), events.CodeStoreUnavailable, true, events.CodeInputsNotReady)
	e.storeExec("RENAME TABLE evaluations_away TO evaluations")
}
