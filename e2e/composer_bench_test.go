package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
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
		for {
			// More than the client's 4,000 publishes awaiting their ack (a long burst) stall it
			// for 200 ms, then fail: wait for acks and go on.
			sent[i] = time.Now()
			_, err := e.js.PublishAsync(r.subject, r.body, jetstream.WithMsgID(r.id))
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				b.Fatal(err)
			}
		}
	}
	// Two minutes, or longer for a burst of more than 10,000 requests.
	limit := max(2*time.Minute, time.Duration(len(reqs))*12*time.Millisecond)
	select {
	case <-done:
	case <-time.After(limit):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("%d of %d answers after %s", got, len(reqs), limit)
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

// BenchmarkComposerPipeline measures a tournament through the real ranker and composer binaries:
// the ingest of its evaluations, then round 6 asked by 10 teams of 200 executions (2,000
// requests: read-your-writes check, ClickHouse reads, render, publish to PROMPTS) of a freshly
// started composer on the default template. The store holds more executions than are composed
// for, as a real one does: cold ingests 400 executions x 10 teams x 5 evaluated rounds (20k
// evaluations), cold-10x 4,000 (200k), every submission and feedback a distinct 1,700-character
// text, as a real tournament makes them; warm (information) ingests only the 200 executions it
// composes for, with one repeated text, which the line cache of token counts hides. BENCH_SCALE=n
// divides the execution counts, for a quick check that the benchmark works.
//
// The unit is CPU, from /proc/<pid>/stat, because the broker, ClickHouse and the services share
// two cores; each figure is a ratio to a baseline measured in the same run, on the same servers:
//   - the broker loop's CPU per message: a client consuming, republishing 2 KiB and acking, plus
//     the in-process server (measured after the ingest: the same server);
//   - ClickHouse's own CPU per `SELECT 1`, 2,000 of them over one native connection;
//   - per prompt, over the whole burst phase: ClickHouse's CPU (x its SELECT 1; in cold-10x also x
//     cold's, when both run in one process) and the composer's (x the broker loop);
//   - per evaluation ingested, from the first publish until the ranker committed the last: the
//     ranker's and ClickHouse's CPU (x the broker loop), and the in-process broker and publishing
//     client's beside them;
//   - one execution's 10 teams asking together on an idle pipeline: p50 latency;
//   - the tournament's total CPU, every process (ranker, composer, ClickHouse, this process with
//     the in-process NATS server): the ingest, the merges it leaves ClickHouse, and the prompts.
//
// Wall-clock rates are reported too, as information. One iteration is one burst.
//
// Scaling out: -composers 1,2,4 (after -args; or BENCH_COMPOSERS=1,2,4, the flag wins) runs cold
// once per count of composer replicas sharing the durable, as cold/composers=N; the other
// workloads run with one, and compare with cold/composers=1 when it runs. With the default, 1,
// cold is named and measured as before. Each run also reports, per prompt over the burst phase,
// the ClickHouse queries (its own counter, system.events 'Query', less the reads of it) and the
// composers' store reads that queried ClickHouse, summed over the replicas as their CPU is.
// BENCH_PROMPTS=n composes for n/10 executions instead of 200 (n requests; the default is
// 2,000), and stores as many more executions as each workload stores beside the ones it composes
// for (cold: twice as many; cold-10x: twenty times), so a longer burst reads the same kind of
// store; BENCH_SCALE then divides both.
func BenchmarkComposerPipeline(b *testing.B) {
	scale := 1
	if s := os.Getenv("BENCH_SCALE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_SCALE=%q: want a whole number of 1 or more", s)
		}
		scale = n
	}
	const teams = 10
	composed := 200
	if s := os.Getenv("BENCH_PROMPTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_PROMPTS=%q: want a whole number of 1 or more", s)
		}
		composed = (n + teams - 1) / teams
	}
	counts, err := composerCounts()
	if err != nil {
		b.Fatal(err)
	}
	nested := !slices.Equal(counts, []int{1})
	// cold-10x's ClickHouse CPU per prompt is compared with cold's of the same process run: the
	// question is whether a ten times larger store costs a prompt more.
	// cold-traced's composer CPU per prompt is compared with cold's: the cost of tracing every
	// request (100% sampling, exported over OTLP/HTTP to a receiver in this process).
	var cold perPrompt
	for _, w := range []workload{
		{name: "cold", stored: 400, composed: 200, cold: true},
		{name: "cold-traced", stored: 400, composed: 200, cold: true, traced: true},
		{name: "cold-10x", stored: 4000, composed: 200, cold: true},
		{name: "warm", stored: 200, composed: 200},
	} {
		w.stored, w.composed = w.stored*composed/w.composed, composed
		w.stored, w.composed = max(1, w.stored/scale), max(1, w.composed/scale)
		b.Run(w.name, func(b *testing.B) {
			if w.name != "cold" {
				ref := perPrompt{}
				if w.cold {
					ref = cold
				}
				benchmarkPipeline(b, w, ref, 1)
				return
			}
			if !nested {
				cold = benchmarkPipeline(b, w, perPrompt{}, 1)
				return
			}
			for _, n := range counts {
				b.Run(fmt.Sprintf("composers=%d", n), func(b *testing.B) {
					got := benchmarkPipeline(b, w, perPrompt{}, n)
					if n == 1 {
						cold = got
					}
				})
			}
		})
	}
}

// composersFlag is BenchmarkComposerPipeline's counts of composer replicas: go test -bench
// ComposerPipeline ./e2e -args -composers 1,2,4.
var composersFlag = flag.String("composers", "", "BenchmarkComposerPipeline: comma-separated counts of composer replicas to run cold with, each a sub-benchmark cold/composers=N (default 1, or BENCH_COMPOSERS)")

// composerCounts is -composers, else BENCH_COMPOSERS, else 1: the counts of composer replicas,
// each once, in the order given.
func composerCounts() ([]int, error) {
	list, from := *composersFlag, "-composers"
	if list == "" {
		list, from = os.Getenv("BENCH_COMPOSERS"), "BENCH_COMPOSERS"
	}
	if strings.TrimSpace(list) == "" {
		return []int{1}, nil
	}
	var counts []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s %q: want a comma-separated list of whole numbers of 1 or more", from, list)
		}
		if !slices.Contains(counts, n) {
			counts = append(counts, n)
		}
	}
	return counts, nil
}

// workload is one tournament of the benchmark: stored executions of 10 teams and 5 evaluated
// rounds in the store, composed of them asking for round 6.
type workload struct {
	name             string
	stored, composed int
	cold             bool // a distinct text for every submission and feedback
	traced           bool // every span of the ranker and the composer sampled and exported
}

// perPrompt is CPU seconds per prompt of ClickHouse and of the composer.
type perPrompt struct{ clickhouse, composer float64 }

// benchmarkPipeline runs one workload with composers replicas sharing the durable and returns
// its CPU per prompt (the composers' summed). Given cold's figures, it reports ClickHouse's
// (cold-10x) or the composer's (cold-traced) as a multiple of them.
func benchmarkPipeline(b *testing.B, w workload, cold perPrompt, composers int) perPrompt {
	coldClickHouse := 0.0
	if !w.traced {
		coldClickHouse = cold.clickhouse
	}
	var tracingEnv []string
	var sink *otlpSink
	if w.traced {
		sink = startOTLPSink(b)
		tracingEnv = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + sink.addr, "OTEL_TRACES_SAMPLER=always_on"}
	}
	e := newEnv(b)
	ctx := context.Background()
	const teams, rounds, workers, selects = 10, 5, 32, 2000
	chPid, self := testenv.ClickHouse(b).Pid(), os.Getpid()

	// The executions asking for round 6 are spread over the store, so their rows lie among other
	// executions' as in a store that keeps finished tournaments; the rest serve the idle 10-team
	// requests, which no read of the burst has warmed.
	stored := make([]string, w.stored)
	var execs, others []string
	for x := range stored {
		stored[x] = fmt.Sprintf("exec-%04d", x)
		if x*w.composed%w.stored < w.composed {
			execs = append(execs, stored[x])
		} else {
			others = append(others, stored[x])
		}
	}

	// Setup: every evaluation of the store, generated before the ingest is measured and spooled
	// to a file rather than held in memory (200k of them are some 750 MB).
	total := w.stored * teams * rounds
	text := "one repeated text"
	if w.cold {
		text = "distinct 1,700-character texts"
	}
	next := spool(b, total, func(i int) outgoing {
		x, k, r := i/(teams*rounds), i/rounds%teams, i%rounds+1
		team := fmt.Sprintf("team-%02d", k)
		content, feedback := strings.Repeat("submission text ", 106), strings.Repeat("feedback text ", 121)
		if w.cold {
			seed := uint64((x*teams+k)*rounds + r)
			content, feedback = coldText(2*seed, 1700), coldText(2*seed+1, 1700)
		}
		ev := evaluation(stored[x], team, "Team "+team, r, float64((x*7+k*13+r*29)%100)+0.25, content, t0.Add(time.Duration(r)*time.Minute))
		ev.Evaluation.Feedback = feedback
		return evaluationMessage(b, published{id: fmt.Sprintf("ev-%s-%s-%d", stored[x], team, r), ev: ev})
	})

	// The ingest, from the first publish until the ranker committed the last evaluation. This
	// process holds the in-process server and the publishing client: their CPU is a figure of its
	// own beside the ranker's and ClickHouse's.
	ranker := e.start("ranker", append([]string{"LOG_LEVEL=warn"}, tracingEnv...)...)
	rankerPid := ranker.cmd.Process.Pid
	ingested := cpuSince(rankerPid, chPid, self)
	start := time.Now()
	publishStream(b, e.js, next)
	waitIngested(b, e, total)
	ingestWall := time.Since(start)
	ingest := ingested()
	// ClickHouse goes on merging the parts the ingest wrote, and a tick's one-row part can start
	// the merge of large ones. Wait until no merge runs, so that merges count in the tournament's
	// total, with every process's CPU meanwhile, and not in the baselines or the prompts.
	var merges float64
	var mergeWall time.Duration
	settle := func() {
		merged := cpuSince(rankerPid, chPid, self)
		mergeWall += waitMerges(b, e, 2*time.Minute)
		merges += sum(merged())
	}
	settle()

	replicas := make([]*proc, composers)
	composerPids := make([]int, composers)
	composerStart := 0.0
	for r := range replicas {
		replicas[r] = e.start("composer", append([]string{"LOG_LEVEL=warn", fmt.Sprintf("COMPOSER_WORKERS=%d", workers), "PPROF=true", os.Getenv("BENCH_COMPOSER_ENV")}, tracingEnv...)...)
		composerPids[r] = replicas[r].cmd.Process.Pid
		composerStart += testenv.CPUSeconds(composerPids[r])
	}
	composer := replicas[0]
	// replicaSum sums a series of every replica's /metrics.
	replicaSum := func(series string) float64 {
		t := 0.0
		for _, p := range replicas {
			t += p.metric(b, series)
		}
		return t
	}

	// Baseline: a broker-only loop over the same server, the same workers, 2 KiB answers. Its
	// CPU (this process: the in-process server and the loop's client) per message is the unit.
	// It always runs 2,000 messages, BENCH_SCALE or not: fewer would be a few ticks of the clock.
	stop := republish(ctx, b, e.js, workers, 2048)
	loopExecs := make([]string, 200)
	for x := range loopExecs {
		loopExecs[x] = fmt.Sprintf("loop-%03d", x)
	}
	base := roundRequests(b, "base", loopExecs, teams, rounds+1)
	for i := range base {
		base[i].subject = "baseline.in." + strings.TrimPrefix(base[i].subject, events.TypeRoundRequested+".")
	}
	s0 := testenv.CPUSeconds(self)
	baseElapsed, baseLat, _ := burst(b, e, base, "baseline.out.>")
	brokerCPU := (testenv.CPUSeconds(self) - s0) / float64(len(base))
	stop()
	brokerRate := float64(len(base)) / baseElapsed.Seconds()

	// Baseline: ClickHouse's CPU for a query that reads nothing, on the same server.
	selectOne := selectOneCPU(b, e, chPid, selects)

	if out := os.Getenv("BENCH_COMPOSER_PROFILE"); out != "" {
		go saveProfile(b, composer, out) // two seconds of the measured bursts
	}
	// ClickHouse's queries, counted by the server (system.events 'Query', since it started),
	// read over a connection of their own; each read of the counter is a query, and what two
	// reads one after the other differ by is taken off every delta.
	queries := queryCounter(b, e)
	q0 := queries()
	readQuery := queries() - q0
	// ClickHouse's own background work (merges, flushes of its logs) with no request, for scale,
	// and the queries meanwhile (other services' polls).
	idle0, idleQ0 := testenv.CPUSeconds(chPid), queries()
	time.Sleep(time.Second)
	chIdle, idleQueries := testenv.CPUSeconds(chPid)-idle0, queries()-idleQ0-readQuery
	var cpuComposer, cpuClickHouse, cpuSelf, cpuRanker float64
	var chQueries float64
	readResults := []string{"queried", "snapshot", "shared", "cached"}
	readCounts := make([]float64, len(readResults))
	b.ResetTimer()
	var elapsed time.Duration
	var lat []time.Duration
	for i := range b.N {
		// Each burst asks for another round's prompts (the first burst is cold for the composer),
		// and a new evaluation elsewhere moves the sequence, so no read kept from the last burst
		// serves this one: in a tournament, evaluations arrive between rounds.
		reqs := roundRequests(b, fmt.Sprintf("run%d", i), execs, teams, rounds+1)
		b.StopTimer()
		tick(b, e, fmt.Sprintf("tick-%d", i), i+1, total+i+1)
		settle()
		b.StartTimer()
		b.StopTimer()
		reads0 := make([]float64, len(readResults))
		for k, r := range readResults {
			reads0[k] = replicaSum(`composer_store_reads_total{result="` + r + `"}`)
		}
		b.StartTimer()
		queries0 := queries()
		burstCPU := cpuSince(append([]int{chPid, self, rankerPid}, composerPids...)...)
		d, l, _ := burst(b, e, reqs, "prompt.>")
		c := burstCPU()
		chQueries += queries() - queries0 - readQuery
		b.StopTimer()
		for k, r := range readResults {
			readCounts[k] += replicaSum(`composer_store_reads_total{result="`+r+`"}`) - reads0[k]
		}
		b.StartTimer()
		cpuClickHouse, cpuSelf, cpuRanker, cpuComposer = cpuClickHouse+c[0], cpuSelf+c[1], cpuRanker+c[2], cpuComposer+sum(c[3:])
		elapsed += d
		lat = append(lat, l...)
	}
	b.StopTimer()

	// Ten teams of one execution asking together on an idle pipeline: the latency of a round.
	// The executions are ones the burst did not compose for when the store has them, and a tick
	// first moves the sequence, so no read kept from the burst serves them.
	tick(b, e, "tick-ten", b.N+1, total+b.N+1)
	ten := others
	if len(ten) == 0 {
		ten = execs
	}
	var tenTeams []time.Duration
	for _, exec := range ten[:min(20, len(ten))] {
		d, _, _ := burst(b, e, roundRequests(b, "ten", []string{exec}, teams, rounds+1), "prompt.>")
		tenTeams = append(tenTeams, d)
	}

	n := float64(b.N * len(execs) * teams)
	evals := float64(total)
	rankerEval, chEval, selfEval := ingest[0]/evals, ingest[1]/evals, ingest[2]/evals
	chPrompt, composerPrompt := cpuClickHouse/n, cpuComposer/n
	tournament := sum(ingest) + merges + cpuComposer + cpuClickHouse + cpuSelf + cpuRanker
	rate := n / elapsed.Seconds()
	b.ReportMetric(evals, "stored-evaluations")
	b.ReportMetric(brokerCPU*1e6, "broker-cpu-µs/msg")
	b.ReportMetric(selectOne*1e6, "clickhouse-cpu-µs/select1")
	b.ReportMetric(chPrompt*1e6, "clickhouse-cpu-µs/prompt")
	b.ReportMetric(chPrompt/selectOne, "clickhouse-prompt-x-select1")
	b.ReportMetric(chPrompt/brokerCPU, "clickhouse-x-broker")
	if coldClickHouse > 0 {
		b.ReportMetric(chPrompt/coldClickHouse, "clickhouse-prompt-x-cold")
	}
	if w.traced && cold.composer > 0 {
		b.ReportMetric(composerPrompt/cold.composer, "composer-x-untraced")
	}
	b.ReportMetric(composerPrompt*1e6, "composer-cpu-µs/prompt")
	b.ReportMetric(composerPrompt/brokerCPU, "composer-x-broker")
	b.ReportMetric(rankerEval*1e6, "ranker-cpu-µs/eval")
	b.ReportMetric(chEval*1e6, "clickhouse-cpu-µs/eval")
	b.ReportMetric(selfEval*1e6, "ingest-broker-cpu-µs/eval")
	b.ReportMetric(rankerEval/brokerCPU, "ranker-x-broker")
	b.ReportMetric(chEval/brokerCPU, "clickhouse-eval-x-broker")
	b.ReportMetric(float64(percentile(tenTeams, 0.5).Microseconds())/1000, "10-teams-p50-ms")
	b.ReportMetric(tournament, "tournament-cpu-s")
	b.ReportMetric(tournament/n*1e6, "tournament-cpu-µs/prompt")
	b.ReportMetric(rate, "prompts/s")
	b.ReportMetric(rate/brokerRate, "rate-vs-broker")
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
	peakRSS, totalRSS := 0, 0 // KiB: the largest replica's, every replica's
	for _, pid := range composerPids {
		peakRSS, totalRSS = max(peakRSS, rssHighWater(pid)), totalRSS+rssHighWater(pid)
	}
	b.ReportMetric(float64(peakRSS)/1024, "composer-peak-rss-MiB")
	b.ReportMetric(chQueries/n, "clickhouse-queries/prompt")
	b.ReportMetric(readCounts[0]/n, "composer-queried-reads/prompt")
	b.ReportMetric(readCounts[1]/n, "composer-snapshot-reads/prompt")

	b.Logf("store: %d evaluations (%d executions x %d teams x %d rounds, %s); round %d for %d executions, %d prompts",
		total, w.stored, teams, rounds, text, rounds+1, len(execs), int(n))
	b.Logf("broker loop: %.1f µs CPU per message (consume, republish 2 KiB, ack: the in-process server and the loop's client), %.0f msgs/s, p50 %s",
		brokerCPU*1e6, brokerRate, round(percentile(baseLat, 0.5)))
	b.Logf("ClickHouse per SELECT 1: %.0f µs CPU (%d over one native connection); idle before the bursts: %.0f ms of CPU per second",
		selectOne*1e6, selects, chIdle*1000)
	vsCold := ""
	if coldClickHouse > 0 {
		vsCold = fmt.Sprintf("; %.2fx cold's in this run", chPrompt/coldClickHouse)
	}
	b.Logf("ClickHouse per prompt: %.0f µs CPU over the burst phase = %.2fx its SELECT 1 = %.1fx the broker loop%s",
		chPrompt*1e6, chPrompt/selectOne, chPrompt/brokerCPU, vsCold)
	b.Logf("composer per prompt: %.0f µs CPU = %.1fx the broker loop (beside it: NATS server and this client %.0f µs, ranker %.0f µs; the composer's start cost %.0f ms)",
		composerPrompt*1e6, composerPrompt/brokerCPU, cpuSelf/n*1e6, cpuRanker/n*1e6, composerStart*1000)
	b.Logf("ingest per evaluation: ranker %.1f µs CPU = %.2fx the broker loop, ClickHouse %.1f µs = %.2fx, in-process broker and publishing client %.1f µs = %.2fx; %.1f s, %.0f evaluations/s; merges after it and the ticks: %.1f s, %.2f CPU-s",
		rankerEval*1e6, rankerEval/brokerCPU, chEval*1e6, chEval/brokerCPU, selfEval*1e6, selfEval/brokerCPU,
		ingestWall.Seconds(), evals/ingestWall.Seconds(), mergeWall.Seconds(), merges)
	b.Logf("one execution's 10 teams on an idle pipeline: p50 %s, p90 %s over %d executions",
		round(percentile(tenTeams, 0.5)), round(percentile(tenTeams, 0.9)), len(tenTeams))
	b.Logf("tournament: %.2f CPU-s, every process = ingest %.2f + merges %.2f + prompts %.2f; %.0f µs per prompt",
		tournament, sum(ingest), merges, cpuComposer+cpuClickHouse+cpuSelf+cpuRanker, tournament/n*1e6)
	b.Logf("burst: %.0f prompts/s = %.3f of the broker loop's rate; p50 %s, p99 %s; composer peak RSS %d MiB",
		rate, rate/brokerRate, round(percentile(lat, 0.5)), round(percentile(lat, 0.99)), peakRSS/1024)
	perRead := make([]string, len(readResults))
	for k, r := range readResults {
		perRead[k] = fmt.Sprintf("%s %.4f", r, readCounts[k]/n)
	}
	b.Logf("composers=%d: %.0f prompts/s; CPU per prompt: composers %.0f µs (all replicas), ClickHouse %.0f µs; ClickHouse queries per prompt %.4f (%.0f over the burst phase, less %.0f per read of the counter; %.0f/s idle before it); composers' store reads per prompt: %s; peak RSS %d MiB per replica, %d MiB together",
		composers, rate, composerPrompt*1e6, chPrompt*1e6, chQueries/n, chQueries, readQuery, idleQueries, strings.Join(perRead, ", "), peakRSS/1024, totalRSS/1024)
	if w.traced {
		spans, requests := sink.counts()
		b.Logf("tracing every request: composer %.0f µs CPU per prompt = %.3fx cold's untraced %.0f µs; %d spans exported in %d OTLP requests",
			composerPrompt*1e6, composerPrompt/cold.composer, cold.composer*1e6, spans, requests)
	}
	if testing.Verbose() {
		b.Logf("store reads (every replica, since start): queried %v, snapshot %v, shared %v, cached %v; content reads from ClickHouse %v (requests served from the stream %v, from ClickHouse %v)",
			replicaSum(`composer_store_reads_total{result="queried"}`), replicaSum(`composer_store_reads_total{result="snapshot"}`), replicaSum(`composer_store_reads_total{result="shared"}`),
			replicaSum(`composer_store_reads_total{result="cached"}`), replicaSum("composer_content_read_duration_seconds_count"),
			replicaSum(`composer_content_reads_total{source="stream"}`), replicaSum(`composer_content_reads_total{source="clickhouse"}`))
		b.Logf("ranker's score snapshots: written %v, too large %v, failed %v",
			ranker.metric(b, `ranker_score_snapshots_total{result="written"}`), ranker.metric(b, `ranker_score_snapshots_total{result="too_large"}`),
			ranker.metric(b, `ranker_score_snapshots_total{result="failed"}`))
		for _, m := range []string{"composer_inputs_wait_seconds", "composer_store_read_duration_seconds", "composer_content_read_duration_seconds", "composer_render_duration_seconds"} {
			if count := replicaSum(m + "_count"); count > 0 {
				b.Logf("%s mean %.3fms", m, 1000*replicaSum(m+"_sum")/count)
			}
		}
	}
	return perPrompt{clickhouse: chPrompt, composer: composerPrompt}
}

// queryCounter opens a connection to e's ClickHouse, closed when the benchmark ends, and returns
// a function reading the server's count of queries since it started (system.events 'Query').
func queryCounter(b *testing.B, e *env) func() float64 {
	b.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{e.chAddr}, Auth: clickhouse.Auth{Database: e.database}, MaxOpenConns: 1, MaxIdleConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return func() float64 {
		var v uint64
		if err := conn.QueryRow(context.Background(), "SELECT value FROM system.events WHERE event = 'Query'").Scan(&v); err != nil {
			b.Fatal(err)
		}
		return float64(v)
	}
}

// tick publishes one evaluation of another execution and waits until the ranker committed it
// (the committed-th): it moves the sequence every prompt waits for.
func tick(b *testing.B, e *env, id string, round, committed int) {
	m := evaluationMessage(b, published{id: id, ev: evaluation("tick", "team-00", "Tick", round, 1, "tick", t0)})
	e.publishRaw(m.subject, m.id, m.body)
	waitCommitted(b, e, committed)
}

// cpuSince starts measuring the CPU time of pids; the function it returns gives each one's CPU
// seconds since then, in the same order.
func cpuSince(pids ...int) func() []float64 {
	before := make([]float64, len(pids))
	for i, pid := range pids {
		before[i] = testenv.CPUSeconds(pid)
	}
	return func() []float64 {
		d := make([]float64, len(pids))
		for i, pid := range pids {
			d[i] = testenv.CPUSeconds(pid) - before[i]
		}
		return d
	}
}

// round keeps a latency's figures that mean something in a log line.
func round(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

func sum(s []float64) float64 {
	t := 0.0
	for _, v := range s {
		t += v
	}
	return t
}

// selectOneCPU is ClickHouse's CPU seconds per `SELECT 1`, n of them one after another over one
// native connection: what the server spends on a query that reads nothing.
func selectOneCPU(b *testing.B, e *env, chPid, n int) float64 {
	b.Helper()
	ctx := context.Background()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{e.chAddr}, Auth: clickhouse.Auth{Database: e.database}, MaxOpenConns: 1, MaxIdleConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	var one uint8
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil { // the handshake, not measured
		b.Fatal(err)
	}
	h0 := testenv.CPUSeconds(chPid)
	for range n {
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			b.Fatal(err)
		}
	}
	return (testenv.CPUSeconds(chPid) - h0) / float64(n)
}

// waitIngested waits until the ranker has committed n evaluations. A large store takes longer
// than waitCommitted's minute, so it fails only when the ack floor stops moving for a minute.
func waitIngested(b *testing.B, e *env, n int) {
	b.Helper()
	last, moved := uint64(0), time.Now()
	for {
		floor := ackFloor(b, e)
		if floor >= uint64(n) {
			return
		}
		if floor > last {
			last, moved = floor, time.Now()
		}
		if time.Since(moved) > time.Minute {
			b.Fatalf("ranker committed %d of %d evaluations and no more for a minute", floor, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMerges waits until ClickHouse has run no merge of the test's database for half a second,
// at most limit, and returns how long it waited.
func waitMerges(b *testing.B, e *env, limit time.Duration) time.Duration {
	b.Helper()
	ctx := context.Background()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{e.chAddr}, Auth: clickhouse.Auth{Database: e.database}, MaxOpenConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	start, quiet := time.Now(), 0
	for quiet < 5 {
		var running uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.merges WHERE database = '"+e.database+"'").Scan(&running); err != nil {
			b.Fatal(err)
		}
		if quiet++; running > 0 {
			quiet = 0
		}
		if time.Since(start) > limit {
			b.Logf("ClickHouse still merging after %s; the merges left count in what follows", limit)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// spool writes n messages made by gen to a file and returns a function that yields them back in
// order, then false. A setup of 200k evaluations (some 750 MB) is thus never held in memory, and
// it is generated before the ingest is measured: an evaluation of two distinct texts costs this
// process more CPU to make than the broker spends on a message.
func spool(b *testing.B, n int, gen func(i int) outgoing) func() (outgoing, bool) {
	b.Helper()
	f, err := os.Create(filepath.Join(b.TempDir(), "spool"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	w := bufio.NewWriterSize(f, 1<<20)
	var head []byte
	for i := range n {
		m := gen(i)
		for _, field := range [][]byte{[]byte(m.id), []byte(m.subject), m.body} {
			head = binary.AppendUvarint(head[:0], uint64(len(field)))
			w.Write(head)
			w.Write(field)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReaderSize(f, 1<<20)
	field := func() []byte {
		size, err := binary.ReadUvarint(r)
		if err == io.EOF {
			return nil
		}
		p := make([]byte, size)
		if err == nil {
			_, err = io.ReadFull(r, p)
		}
		if err != nil {
			b.Fatalf("spool: %v", err)
		}
		return p
	}
	return func() (outgoing, bool) {
		id := field()
		if id == nil {
			return outgoing{}, false
		}
		subject := field()
		return outgoing{id: string(id), subject: string(subject), body: field()}, true
	}
}
