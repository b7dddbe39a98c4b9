package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// outgoing is one message ready to publish: a round.requested, or in setup an evaluation.
type outgoing struct {
	id, subject string
	body        []byte
}

// burst publishes every request asynchronously and waits until an answer to each has arrived on
// the core subject answers, matched by its Nats-Msg-Id (the prompt event id of the request). It
// returns the time from the first publish to the last answer and each request's latency, and the
// answers' mean body size.
func burst(b *testing.B, e *env, reqs []outgoing, answers string) (time.Duration, []time.Duration, int) {
	b.Helper()
	index := make(map[string]int, len(reqs))
	for i, r := range reqs {
		index[events.PromptEventID(r.id)] = i
	}
	sent := make([]time.Time, len(reqs))
	arrived := make([]time.Time, len(reqs))
	var mu sync.Mutex
	got, bytes, failed := 0, 0, ""
	done := make(chan struct{})
	sub, err := e.nc.Subscribe(answers, func(m *nats.Msg) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		i, ok := index[m.Header.Get(jetstream.MsgIDHeader)]
		if !ok || !arrived[i].IsZero() {
			return // another run's answer, or a duplicate the stream drops
		}
		if strings.HasPrefix(m.Subject, events.TypePromptFailed) {
			failed = string(m.Data)
		}
		arrived[i] = now
		bytes += len(m.Data)
		if got++; got == len(reqs) {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := e.nc.Flush(); err != nil {
		b.Fatal(err)
	}
	for i, r := range reqs {
		sent[i] = time.Now()
		if _, err := e.js.PublishAsync(r.subject, r.body, jetstream.WithMsgID(r.id)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("%d of %d answers after 2 minutes", got, len(reqs))
	}
	mu.Lock()
	defer mu.Unlock()
	if failed != "" {
		b.Fatalf("a request failed: %s", failed)
	}
	lat := make([]time.Duration, len(reqs))
	last := arrived[0]
	for i := range reqs {
		lat[i] = arrived[i].Sub(sent[i])
		if arrived[i].After(last) {
			last = arrived[i]
		}
	}
	return last.Sub(sent[0]), lat, bytes / len(reqs)
}

// roundRequests builds the requests of one round for the teams of the given executions.
func roundRequests(b *testing.B, prefix string, execs []string, teams, round int) []outgoing {
	var out []outgoing
	for _, exec := range execs {
		for k := range teams {
			team := fmt.Sprintf("team-%02d", k)
			id := fmt.Sprintf("%s-%s-%s", prefix, exec, team)
			body, err := events.Marshal(id, "orchestrator/bench", events.TypeRoundRequested, t0.Add(time.Hour), events.RoundRequested{
				ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: round, MaxRounds: 10,
				UserPrompt: "Write the best possible answer to the task, improving on your earlier rounds."})
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, outgoing{id: id, subject: events.RoundSubject(exec, team), body: body})
		}
	}
	return out
}

// republish is the baseline: a plain Go client doing the composer's broker work and nothing
// else, with as many workers: pull a request, publish an answer of the composer's answer size
// under a derived id and wait for its ack, ack the request.
func republish(ctx context.Context, b *testing.B, js jetstream.JetStream, workers, answerBytes int) func() {
	for _, s := range []struct{ name, subject string }{{"BASELINE_IN", "baseline.in.>"}, {"BASELINE_OUT", "baseline.out.>"}} {
		cfg, err := events.StreamConfig(events.StreamRounds, events.StreamOptions{})
		if err != nil {
			b.Fatal(err)
		}
		cfg.Name, cfg.Subjects, cfg.Description = s.name, []string{s.subject}, "composer benchmark baseline"
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			b.Fatal(err)
		}
	}
	ccfg, err := events.ConsumerConfig(events.ConsumerComposer, events.ConsumerOptions{AckWait: 30 * time.Second, MaxAckPending: 4 * workers, MaxDeliver: 10})
	if err != nil {
		b.Fatal(err)
	}
	ccfg.Durable, ccfg.FilterSubject, ccfg.Description = "baseline", "baseline.in.>", "composer benchmark baseline"
	cons, err := js.CreateOrUpdateConsumer(ctx, "BASELINE_IN", ccfg)
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(workers))
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(strings.Repeat("p", answerBytes))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				msg, err := it.Next()
				if err != nil {
					return
				}
				id := events.PromptEventID(msg.Headers().Get(jetstream.MsgIDHeader))
				if _, err := js.Publish(ctx, "baseline.out."+strings.TrimPrefix(msg.Subject(), "baseline.in."), payload, jetstream.WithMsgID(id)); err != nil {
					b.Error(err)
				}
				_ = msg.Ack()
			}
		})
	}
	return func() { it.Stop(); wg.Wait() }
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// coldText is a distinct text of n bytes, as a team or an evaluator writes one: words of a
// pseudo-language drawn with a Zipf distribution (a few common, a long tail of rare ones), in
// sentences, seeded by where it appears. No two texts share a line, so no cache can hide the
// cost of counting or reading them.
func coldText(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	zipf := rand.NewZipf(rng, 1.1, 2, 50_000)
	syllables := []string{"ka", "to", "ri", "mu", "se", "na", "lo", "vi", "de", "pa", "xu", "qe", "bo", "fi", "gu", "zy"}
	var b strings.Builder
	for words := 0; b.Len() < n; words++ {
		w := zipf.Uint64()
		if words > 0 {
			b.WriteByte(' ')
		}
		for w > 0 || b.Len() == 0 {
			b.WriteString(syllables[w%16])
			w /= 16
			if w == 0 {
				break
			}
		}
		if rng.IntN(12) == 0 {
			b.WriteString(".")
			if rng.IntN(4) == 0 {
				fmt.Fprintf(&b, " %d", rng.IntN(10_000))
			}
		}
	}
	return b.String()[:n]
}

// BenchmarkComposerPipeline measures the real composer binary (round request in, read-your-writes
// check, ClickHouse reads, render, publish to PROMPTS) on 2,000 requests: 200 executions of 10
// teams asking for round 6 after 5 evaluated rounds, on the default template, with a freshly
// started composer. cold: every submission and feedback distinct (1,700 characters), as a real
// tournament makes them; warm: one repeated text, which the line cache of token counts hides.
//
// The unit is CPU, from /proc/<pid>/stat, because the broker, ClickHouse and the services share
// two cores: CPU per prompt of the composer and of ClickHouse, divided by the CPU per message of
// a broker-only loop (a client consuming, republishing 2 KiB and acking, on the same server) in
// the same run. Wall-clock rates are reported too, as information. One iteration is one burst.
func BenchmarkComposerPipeline(b *testing.B) {
	for _, cold := range []bool{true, false} {
		name := "warm"
		if cold {
			name = "cold"
		}
		b.Run(name, func(b *testing.B) { benchmarkPipeline(b, cold) })
	}
}

func benchmarkPipeline(b *testing.B, cold bool) {
	e := newEnv(b)
	ctx := context.Background()
	const executions, teams, rounds, workers = 200, 10, 5, 32
	e.start("ranker", "LOG_LEVEL=warn")

	// Setup, not measured: 10,000 evaluations committed by the ranker.
	var msgs []outgoing
	execs := make([]string, executions)
	for x := range executions {
		execs[x] = fmt.Sprintf("exec-%03d", x)
		for k := range teams {
			team := fmt.Sprintf("team-%02d", k)
			for r := 1; r <= rounds; r++ {
				content, feedback := strings.Repeat("submission text ", 106), strings.Repeat("feedback text ", 121)
				if cold {
					seed := uint64((x*teams+k)*rounds + r)
					content, feedback = coldText(2*seed, 1700), coldText(2*seed+1, 1700)
				}
				ev := evaluation(execs[x], team, "Team "+team, r, float64((x*7+k*13+r*29)%100)+0.25, content, t0.Add(time.Duration(r)*time.Minute))
				ev.Evaluation.Feedback = feedback
				msgs = append(msgs, evaluationMessage(b, published{id: fmt.Sprintf("ev-%s-%s-%d", execs[x], team, r), ev: ev}))
			}
		}
	}
	publishAcked(b, e.js, msgs)
	waitCommitted(b, e, executions*teams*rounds)
	composer := e.start("composer", "LOG_LEVEL=warn", fmt.Sprintf("COMPOSER_WORKERS=%d", workers), "PPROF=true", os.Getenv("BENCH_COMPOSER_ENV"))
	chPid, self := testenv.ClickHouse(b).Pid(), os.Getpid()

	// Baseline: a broker-only loop over the same server, the same workers, 2 KiB answers. Its
	// CPU (this process: the in-process server and the loop's client) per message is the unit.
	stop := republish(ctx, b, e.js, workers, 2048)
	base := roundRequests(b, "base", execs, teams, rounds+1)
	for i := range base {
		base[i].subject = "baseline.in." + strings.TrimPrefix(base[i].subject, events.TypeRoundRequested+".")
	}
	s0 := cpuSeconds(self)
	baseElapsed, baseLat, _ := burst(b, e, base, "baseline.out.>")
	brokerCPU := (cpuSeconds(self) - s0) / float64(len(base))
	stop()
	brokerRate := float64(len(base)) / baseElapsed.Seconds()

	if out := os.Getenv("BENCH_COMPOSER_PROFILE"); out != "" {
		go saveProfile(b, composer, out) // two seconds of the measured bursts
	}
	// ClickHouse's own background work (merges, flushes of its logs) with no request, for scale.
	idle0 := cpuSeconds(chPid)
	time.Sleep(time.Second)
	chIdle := cpuSeconds(chPid) - idle0
	var cpuComposer, cpuClickHouse, cpuSelf float64
	b.ResetTimer()
	var elapsed time.Duration
	var lat []time.Duration
	for i := range b.N {
		// Each burst asks for another round's prompts (the first burst is cold for the composer),
		// and a new evaluation elsewhere moves the sequence, so no read kept from the last burst
		// serves this one: in a tournament, evaluations arrive between rounds.
		reqs := roundRequests(b, fmt.Sprintf("run%d", i), execs, teams, rounds+1)
		b.StopTimer()
		tick := evaluationMessage(b, published{id: fmt.Sprintf("tick-%d", i), ev: evaluation("tick", "team-00", "Tick", i+1, 1, "tick", t0)})
		e.publishRaw(tick.subject, tick.id, tick.body)
		waitCommitted(b, e, executions*teams*rounds+i+1)
		b.StartTimer()
		c0, h0, s0 := cpuSeconds(composer.cmd.Process.Pid), cpuSeconds(chPid), cpuSeconds(self)
		d, l, _ := burst(b, e, reqs, "prompt.>")
		cpuComposer += cpuSeconds(composer.cmd.Process.Pid) - c0
		cpuClickHouse += cpuSeconds(chPid) - h0
		cpuSelf += cpuSeconds(self) - s0
		elapsed += d
		lat = append(lat, l...)
	}
	b.StopTimer()

	// Ten teams of one execution asking together on an idle pipeline: the latency of a round.
	var tenTeams []time.Duration
	for _, exec := range execs[:20] {
		d, _, _ := burst(b, e, roundRequests(b, "ten", []string{exec}, teams, rounds+1), "prompt.>")
		tenTeams = append(tenTeams, d)
	}

	n := float64(b.N * executions * teams)
	rate := float64(b.N*executions*teams) / elapsed.Seconds()
	b.ReportMetric(brokerCPU*1e6, "broker-cpu-µs/msg")
	b.ReportMetric(cpuComposer/n*1e6, "composer-cpu-µs/prompt")
	b.ReportMetric(cpuClickHouse/n*1e6, "clickhouse-cpu-µs/prompt")
	b.ReportMetric(cpuComposer/n/brokerCPU, "composer-x-broker")
	b.ReportMetric(cpuClickHouse/n/brokerCPU, "clickhouse-x-broker")
	b.ReportMetric(rate, "prompts/s")
	b.ReportMetric(rate/brokerRate, "rate-vs-broker")
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(percentile(tenTeams, 0.5).Microseconds())/1000, "10-teams-p50-ms")
	b.ReportMetric(float64(rssHighWater(composer.cmd.Process.Pid))/1024, "composer-peak-rss-MiB")
	if testing.Verbose() {
		b.Logf("CPU per prompt: composer %.0fµs, ClickHouse %.0fµs, NATS server and this client %.0fµs; broker loop %.0fµs per message (%.0f msgs/s, p50 %s); ClickHouse idle: %.0f ms of CPU per second",
			cpuComposer/n*1e6, cpuClickHouse/n*1e6, cpuSelf/n*1e6, brokerCPU*1e6, brokerRate, percentile(baseLat, 0.5), chIdle*1000)
		b.Logf("store reads: queried %v, shared %v, cached %v; content reads %v", composer.metric(b, `composer_store_reads_total{result="queried"}`),
			composer.metric(b, `composer_store_reads_total{result="shared"}`), composer.metric(b, `composer_store_reads_total{result="cached"}`),
			composer.metric(b, "composer_content_read_duration_seconds_count"))
		for _, m := range []string{"composer_inputs_wait_seconds", "composer_store_read_duration_seconds", "composer_content_read_duration_seconds", "composer_render_duration_seconds"} {
			b.Logf("%s mean %.3fms", m, 1000*composer.metric(b, m+"_sum")/composer.metric(b, m+"_count"))
		}
	}
}
