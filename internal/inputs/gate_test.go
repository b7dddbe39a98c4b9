package inputs

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// stepClock is a clock that moves only when told.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestStoreReadsWaitOutARefill: a ClickHouse read starts only on a probe younger than
// chstore.ProbeFresh that saw no refill. Once the ranker's consumer says it refills, a read on a
// probe that old probes again and answers inputs_not_ready without touching the store; once the
// refill is over, reads go on.
func TestStoreReadsWaitOutARefill(t *testing.T) {
	st, _ := testenv.Store(t, true)
	if err := st.Insert(t.Context(), []rank.Record{evalRecord("e", 1, 16)}); err != nil {
		t.Fatal(err)
	}
	_, js := testenv.JetStream(t, testenv.NATS(t))
	createEvaluations(t, js)
	cons := createRanker(t, js)
	clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
	lin := &lineage{}
	g := gate{store: st, probes: newProbes(js, clock.Now, 5*time.Second, lin), l: lin, now: clock.Now}
	read := func() error {
		evs, err := g.Scores(t.Context(), []string{"e"})
		if got := teamsOf(evs["e"]); err == nil && (len(got) != 1 || got[0] != "team-e") {
			t.Fatalf("the read answered teams %v, want team-e", got)
		}
		return err
	}
	setRefilling := func(why string) {
		t.Helper()
		cfg := cons.CachedInfo().Config
		cfg.Metadata = map[string]string{events.MetaStoreLineage: "1@x"}
		if why != "" {
			cfg.Metadata[events.MetaStoreRefilling] = why
		}
		if _, err := js.UpdateConsumer(context.Background(), events.StreamEvaluations, cfg); err != nil {
			t.Fatal(err)
		}
	}

	if err := read(); err != nil {
		t.Fatalf("no refill: %v", err)
	}
	setRefilling("the evaluations table is missing")
	// The probe that admitted the last read is younger than ProbeFresh: this read starts, and
	// the ranker, which waits chstore.RefillGrace before it touches the table, has not touched it.
	clock.add(chstore.ProbeFresh / 2)
	if err := read(); err != nil {
		t.Fatalf("a read on a fresh probe: %v", err)
	}
	clock.add(chstore.ProbeFresh / 2)
	err := read()
	var f *events.Failure
	if !errors.As(err, &f) || f.Code != events.CodeInputsNotReady || !f.Retryable || !strings.Contains(f.Message, "the evaluations table is missing") {
		t.Fatalf("a read on a probe ProbeFresh old while the ranker refills: %v, want a retryable inputs_not_ready naming the refill", err)
	}
	// Reads fail at once while the refill lasts, each after a new probe once the last is old.
	clock.add(chstore.ProbeFresh)
	if err := read(); err == nil {
		t.Fatal("a read during the refill started")
	}
	setRefilling("")
	if err := read(); err == nil {
		t.Fatal("a read on a probe younger than ProbeFresh that saw the refill started")
	}
	clock.add(chstore.ProbeFresh)
	if err := read(); err != nil {
		t.Fatalf("after the refill: %v", err)
	}
}
