package inputs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

const evaluationSubject = events.TypeEvaluationCompleted + ".e.t"

func createEvaluations(t *testing.T, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	cfg, err := events.StreamConfig(events.StreamEvaluations, events.StreamOptions{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func createRanker(t *testing.T, js jetstream.JetStream) jetstream.Consumer {
	t.Helper()
	cfg, err := events.ConsumerConfig(events.ConsumerRanker, events.ConsumerOptions{AckWait: 30 * time.Second, MaxAckPending: 100, MaxDeliver: -1})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(context.Background(), events.StreamEvaluations, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// publishEvaluations publishes n evaluation messages and returns the sequence of the last.
func publishEvaluations(t *testing.T, js jetstream.JetStream, n int) uint64 {
	t.Helper()
	var last uint64
	for i := range n {
		ack, err := js.Publish(context.Background(), evaluationSubject, []byte(fmt.Sprintf(`{"n":%d}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	return last
}

// rankerAcks pulls up to pull messages on the ranker consumer, checks it got n, and acks the
// first acks of them, each confirmed by the server.
func rankerAcks(t *testing.T, cons jetstream.Consumer, pull, n, acks int) {
	t.Helper()
	wait := 5 * time.Second
	if pull > n {
		wait = 300 * time.Millisecond // the pull ends short
	}
	batch, err := cons.Fetch(pull, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for msg := range batch.Messages() {
		if got < acks {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := msg.DoubleAck(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		got++
	}
	if err := batch.Error(); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("fetched %d messages, want %d", got, n)
	}
}

func TestCommitProbe(t *testing.T) {
	type check struct {
		target uint64
		want   bool
		reason string // a part of the reason; "" when committed
	}
	tests := []struct {
		name         string
		setup        func(t *testing.T, js jetstream.JetStream)
		wantNoStream bool
		wantLastSeq  uint64
		wantConsumer bool
		checks       []check
	}{
		{
			name:         "no EVALUATIONS stream",
			setup:        func(t *testing.T, js jetstream.JetStream) {},
			wantNoStream: true,
			checks: []check{
				{target: 0, want: false, reason: "EVALUATIONS stream not found"},
				{target: 3, want: false, reason: "EVALUATIONS stream not found"},
			},
		},
		{
			name: "three evaluations, none acked by the ranker",
			setup: func(t *testing.T, js jetstream.JetStream) {
				createEvaluations(t, js)
				createRanker(t, js)
				publishEvaluations(t, js, 3)
			},
			wantLastSeq:  3,
			wantConsumer: true,
			checks: []check{
				{target: 0, want: true},
				{target: 3, want: false, reason: "committed up to sequence 0 of 3"},
			},
		},
		{
			name: "three evaluations, all acked, while the ranker refills its store",
			setup: func(t *testing.T, js jetstream.JetStream) {
				createEvaluations(t, js)
				cons := createRanker(t, js)
				publishEvaluations(t, js, 3)
				rankerAcks(t, cons, 3, 3, 3)
				cfg := cons.CachedInfo().Config
				cfg.Metadata = map[string]string{events.MetaStoreRefilling: "the evaluations table is missing", events.MetaStoreLineage: "1@x"}
				if _, err := js.UpdateConsumer(context.Background(), events.StreamEvaluations, cfg); err != nil {
					t.Fatal(err)
				}
			},
			wantLastSeq:  3,
			wantConsumer: true,
			checks: []check{
				{target: 0, want: false, reason: "refilling ClickHouse from EVALUATIONS (the evaluations table is missing)"},
				{target: 3, want: false, reason: "refilling"},
			},
		},
		{
			name: "three evaluations, two acked",
			setup: func(t *testing.T, js jetstream.JetStream) {
				createEvaluations(t, js)
				cons := createRanker(t, js)
				publishEvaluations(t, js, 3)
				rankerAcks(t, cons, 3, 3, 2)
			},
			wantLastSeq:  3,
			wantConsumer: true,
			checks: []check{
				{target: 2, want: true},
				{target: 3, want: false, reason: "committed up to sequence 2 of 3"},
			},
		},
		{
			name: "three evaluations, all acked",
			setup: func(t *testing.T, js jetstream.JetStream) {
				createEvaluations(t, js)
				cons := createRanker(t, js)
				publishEvaluations(t, js, 3)
				rankerAcks(t, cons, 3, 3, 3)
			},
			wantLastSeq:  3,
			wantConsumer: true,
			checks: []check{
				{target: 1, want: true},
				{target: 3, want: true},
				{target: 4, want: false, reason: "committed up to sequence 3 of 4"},
			},
		},
		{
			// The ack floor and Delivered stop at the ranker's last message (2) when the stream's
			// last one is not the ranker's to ack: the probe cannot tell that from a message stored
			// but not yet counted as pending, so it waits (for the next evaluation, or the timeout).
			name: "a message outside the ranker's filter after its acked ones",
			setup: func(t *testing.T, js jetstream.JetStream) {
				cfg, err := events.StreamConfig(events.StreamEvaluations, events.StreamOptions{Replicas: 1})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Subjects = append(cfg.Subjects, "other.>")
				if _, err := js.CreateStream(context.Background(), cfg); err != nil {
					t.Fatal(err)
				}
				cons := createRanker(t, js)
				publishEvaluations(t, js, 2)
				if _, err := js.Publish(context.Background(), "other.x", []byte("{}")); err != nil {
					t.Fatal(err)
				}
				rankerAcks(t, cons, 3, 2, 2) // a pull for more than there is: the server scans past 3
			},
			wantLastSeq:  3,
			wantConsumer: true,
			checks: []check{
				{target: 2, want: true},
				{target: 3, want: false, reason: "committed up to sequence 2 of 3"},
			},
		},
		{
			// Likewise for a last message an operator deleted before the ranker was handed it.
			name: "the stream's last message deleted after the ranker acked the others",
			setup: func(t *testing.T, js jetstream.JetStream) {
				st := createEvaluations(t, js)
				cons := createRanker(t, js)
				last := publishEvaluations(t, js, 3)
				if err := st.DeleteMsg(context.Background(), last); err != nil {
					t.Fatal(err)
				}
				rankerAcks(t, cons, 3, 2, 2)
			},
			wantLastSeq:  3,
			wantConsumer: true,
			checks: []check{
				{target: 2, want: true},
				{target: 3, want: false, reason: "committed up to sequence 2 of 3"},
			},
		},
		{
			name: "ranker consumer missing",
			setup: func(t *testing.T, js jetstream.JetStream) {
				createEvaluations(t, js)
				publishEvaluations(t, js, 3)
			},
			wantLastSeq: 3,
			checks: []check{
				{target: 0, want: false, reason: "ranker consumer not found"},
				{target: 3, want: false, reason: "ranker consumer not found"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, js := testenv.JetStream(t, testenv.NATS(t))
			tt.setup(t, js)
			c := newProbes(js, time.Now, 5*time.Second, &lineage{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, err := c.join(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if p.streamErr != nil {
				t.Fatalf("stream error: %v", p.streamErr)
			}
			if p.noStream != tt.wantNoStream {
				t.Errorf("noStream = %v, want %v", p.noStream, tt.wantNoStream)
			}
			if p.lastSeq != tt.wantLastSeq {
				t.Errorf("lastSeq = %d, want %d", p.lastSeq, tt.wantLastSeq)
			}
			if got := p.consumer != nil; got != tt.wantConsumer {
				t.Errorf("consumer found = %v (err %v), want %v", got, p.consumeErr, tt.wantConsumer)
			}
			for _, ch := range tt.checks {
				ok, reason := p.committed(ch.target)
				if ok != ch.want {
					t.Errorf("committed(%d) = %v (%q), want %v", ch.target, ok, reason, ch.want)
				}
				if ch.reason == "" && reason != "" || !strings.Contains(reason, ch.reason) {
					t.Errorf("committed(%d) reason = %q, want it to contain %q", ch.target, reason, ch.reason)
				}
			}
		})
	}
}

func TestCommitProbeStreamError(t *testing.T) {
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	createEvaluations(t, js)
	nc.Close()
	c := newProbes(js, time.Now, 5*time.Second, &lineage{})
	p, err := c.join(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ok, reason := p.committed(0)
	if ok || p.streamErr == nil || !strings.HasPrefix(reason, "EVALUATIONS stream: ") {
		t.Errorf("on a closed connection: committed(0) = (%v, %q), streamErr %v; want false, an EVALUATIONS stream error", ok, reason, p.streamErr)
	}
}

// TestCommitProbeJoinersGetALaterProbe checks the join contract under concurrency: every caller
// publishes an evaluation and then joins, and the probe it gets must have read the stream after
// that evaluation was acknowledged.
func TestCommitProbeJoinersGetALaterProbe(t *testing.T) {
	_, js := testenv.JetStream(t, testenv.NATS(t))
	createEvaluations(t, js)
	createRanker(t, js)
	c := newProbes(js, time.Now, 5*time.Second, &lineage{})

	const callers = 50
	type result struct {
		published uint64
		p         *probe
		err       error
	}
	results := make([]result, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ack, err := js.Publish(ctx, evaluationSubject, []byte("{}"))
			if err != nil {
				results[i].err = err
				return
			}
			results[i].published = ack.Sequence
			results[i].p, results[i].err = c.join(ctx)
		}()
	}
	wg.Wait()

	probes := map[*probe]bool{}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		if r.p.lastSeq < r.published {
			t.Errorf("caller %d published sequence %d before joining but its probe read last sequence %d", i, r.published, r.p.lastSeq)
		}
		if r.p.consumer == nil {
			t.Errorf("caller %d: probe found no ranker consumer (err %v)", i, r.p.consumeErr)
		}
		probes[r.p] = true
	}
	t.Logf("%d callers shared %d probes", callers, len(probes))

	// Once every caller is served the loop stops; a later join starts it again and still gets a
	// probe that sees everything published.
	p, err := c.join(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(uint64(callers), p.lastSeq); diff != "" {
		t.Errorf("lastSeq of a join after the burst (-want +got):\n%s", diff)
	}
	if requests, keys := c.b.queuedFor(struct{}{}); requests != 0 || keys != 0 {
		t.Errorf("%d requests wait for a probe with no caller waiting", requests)
	}
}
