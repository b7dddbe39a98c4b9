package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	gocmp "github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestChaosSoak plays tournaments (several executions, two composer replicas, replays and
// re-evaluations) while a seeded schedule injects faults, every kind once per cycle in a seeded
// order (soakFaults), now and then two at once: the ranker, composer replicas and the archiver
// killed with SIGKILL or stopped with SIGSTOP, the NATS server restarted, ClickHouse frozen, a
// durable consumer deleted, each stream deleted, the evaluations table dropped or truncated, the
// prompts archive dropped, a template whose sections multiply pushed and asked for, poison
// events. Then, once every service is back, against an oracle of the test's own (what the
// orchestrators saw acknowledged, recounted by truth, never pkg/rank):
//   - every request JetStream acknowledged is answered exactly once (PROMPTS, and the archive for
//     the PROMPTS streams deleted), by an answer of its execution, team and round;
//   - every composed prompt's leaderboard and history equal the recount as of its position
//     (evaluations_era, evaluations_seq), and that position is at or past every evaluation
//     acknowledged before the request was published;
//   - failures are bounded (soakMaxFailures of the requests) and each one explained: poison
//     requests answer invalid_request, the hostile template budget_exceeded, and a retryable
//     failure is answered during or shortly after a fault (soakExplains);
//   - the prompts archive holds every PROMPTS record once, byte for byte;
//   - every leaderboard equals the recount;
//   - `podium prompts verify --all` re-renders the prompts of a sample of executions to their bytes;
//   - no service was ready with work pending and none of it done for more than soakIdleLimit
//     (from a log of probes taken every 500 ms).
//
// Streams are deleted as an operator would who wants nothing lost: EVALUATIONS once the ranker
// committed what it holds (an execution's evaluations then all belong to one stream: the
// orchestrators start new executions after it), ROUNDS and PROMPTS once every request was answered
// and archived. An execution whose stream was deleted and whose table was dropped after is lost
// with both copies: it is counted, and left out of the checks of what the store holds. Each such
// loss, of evaluations or of prompt records, must be named by the ranker or the archiver, which
// wait for an operator: the soak accepts it (`podium store accept-loss [--archive]`), and fails
// when none is named where its own bookkeeping says one was made.
//
// PODIUM_SOAK sets how long it plays (default 100s, at least one cycle of every fault; `make
// soak` plays 30 minutes) and PODIUM_SOAK_SEED the schedule (default: the clock). The seed is
// printed first: a failing seed plays the same schedule again.
func TestChaosSoak(t *testing.T) {
	t.Parallel()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	play := 100 * time.Second
	if v := os.Getenv("PODIUM_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("PODIUM_SOAK: %v", err)
		}
		play = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("PODIUM_SOAK_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("PODIUM_SOAK_SEED: %v", err)
		}
		seed = s
	}
	t.Logf("chaos soak: seed %d (PODIUM_SOAK_SEED=%d reproduces the schedule), playing %s", seed, seed, play)

	s := newSoak(t, seed)
	var wg sync.WaitGroup
	for x := range soakExecutions {
		wg.Go(func() { s.orchestrate(fmt.Sprintf("soak-%d", x), seed+uint64(x)) })
	}
	probesDone := make(chan struct{})
	stopProbes := make(chan struct{})
	go func() { defer close(probesDone); s.probe(stopProbes) }()
	s.chaos(time.Now().Add(play))
	close(s.stop)
	wg.Wait()

	// Every fault is healed by now: the services catch up by themselves.
	s.waitQuiet()
	close(stopProbes)
	<-probesDone
	s.check()
}

const (
	soakExecutions = 3 // played at once, each by its own orchestrator
	soakTeams      = 4
	soakRounds     = 10
	soakVerified   = 40 // executions podium prompts verify re-renders whole
	// soakIdleLimit is how long a service may be ready while work is pending and none of it gets
	// done: the soak's composers wait 5 s for the ranker (COMPOSER_INPUTS_TIMEOUT), then settle.
	soakIdleLimit = 10 * time.Second
	// soakExplains is how long after a fault healed a retryable failure counts as its doing.
	soakExplains = 30 * time.Second
	// soakMaxFailures bounds the retryable failures, as a share of the requests.
	soakMaxFailures = 0.10
)

// soakFaults are the kinds of fault, each injected once per cycle of the schedule.
var soakFaults = []string{"kill ranker", "kill composer", "kill archiver", "stop service", "restart nats", "freeze clickhouse",
	"delete durable", "drop table", "truncate table", "drop archive", "delete EVALUATIONS", "delete ROUNDS", "delete PROMPTS",
	"delete LEADERBOARDS", "hostile template", "poison", "overlap"}

// soakOverlapping are the kinds that may be injected two at once ("overlap").
var soakOverlapping = []string{"kill ranker", "kill composer", "kill archiver", "stop service", "freeze clickhouse", "delete durable",
	"drop table", "truncate table", "drop archive", "restart nats"}

// soak is one soak's servers, services, and what the orchestrators saw acknowledged.
type soak struct {
	t    *testing.T
	e    *env
	rng  *rand.Rand // the schedule's: used by chaos alone
	ch   *servers.ClickHouse
	port int
	dir  string
	stop chan struct{} // closed when the schedule is done: the orchestrators finish

	nsMu sync.Mutex
	ns   *server.Server

	mu       sync.Mutex
	services map[string]*soakService
	faults   []string       // "at: what", in order
	windows  [][2]time.Time // when each fault began and healed
	idle     []string       // probe log violations
	unready  map[string]time.Duration
	hostile  int // versions of the hostile template pushed

	// evalGate is read-held by every publication of an evaluation and held by a deletion of
	// EVALUATIONS; reqGate likewise for requests and the deletions of ROUNDS and PROMPTS.
	evalGate, reqGate sync.RWMutex

	evMu      sync.Mutex
	evals     []ackedEval          // every evaluation acknowledged, in order
	inc       int                  // EVALUATIONS' incarnation: deletions so far
	execInc   map[string]int       // the incarnation of each execution's evaluations
	destroyed map[string]time.Time // executions lost with their stream and their table: when
	// promptsDeleted is when PROMPTS was last deleted; archiveLost when the archive was dropped
	// after that: the answers of the requests published before it are lost with both copies.
	promptsDeleted, archiveLost time.Time
	// promptsInc counts PROMPTS' deletions; archiveFloorInc is the first incarnation of PROMPTS
	// whose records the archive holds (the archiver's floor): the archive dropped while it is
	// below promptsInc loses the records of the incarnations before, which the archiver must name
	// and an operator accept (settleArchiveLoss).
	promptsInc, archiveFloorInc int
	// tableFault is when the evaluations table was last dropped or truncated, in incarnation
	// tableFaultInc: EVALUATIONS is deleted only once the ranker refilled the table since.
	tableFault    time.Time
	tableFaultInc int
	// floorInc is the first incarnation of EVALUATIONS whose rows the table holds (the ranker's
	// floor): a table fault while it is below inc loses the rows of the incarnations before it,
	// which the ranker must name and an operator accept (settleLoss).
	floorInc int

	requests  sync.Map // request id -> soakRequest: acknowledged by JetStream
	seen      sync.Map // event id -> record: answers the orchestrators read in PROMPTS
	published atomic.Int64
	answered  atomic.Int64 // seen by the orchestrators in time
	late      atomic.Int64 // not seen within their wait
}

// ackedEval is an evaluation JetStream acknowledged: where (the stream's incarnation, its sequence).
type ackedEval struct {
	p   published
	inc int
	seq uint64
}

// record is an answer as a stream stored it, and when.
type record struct {
	body []byte
	at   time.Time
}

// soakRequest is a request JetStream acknowledged, with the last evaluation acknowledged before
// it was published, and what kind it is ("", "poison", "hostile").
type soakRequest struct {
	exec, team string
	round      int
	inc        int
	seq        uint64
	kind       string
	at         time.Time // published
}

// soakService is one running service process and how to start it again.
type soakService struct {
	name, bin string
	extra     []string
	p         *proc
}

func newSoak(t *testing.T, seed uint64) *soak {
	_, portText, _ := net.SplitHostPort(freeAddr(t))
	port, _ := strconv.Atoi(portText)
	s := &soak{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), port: port, dir: t.TempDir(), services: map[string]*soakService{},
		unready: map[string]time.Duration{}, stop: make(chan struct{}), execInc: map[string]int{}, destroyed: map[string]time.Time{}}
	s.ns = startNATSAt(t, port, s.dir)
	t.Cleanup(func() {
		s.nsMu.Lock()
		defer s.nsMu.Unlock()
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
	nc, err := nats.Connect(s.ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s.ch = testenv.PrivateClickHouse(t) // frozen and written to by hand below: not the shared one
	s.e = &env{t: t, ns: s.ns, nc: nc, js: js, chAddr: s.ch.Addr, database: "soak"}
	// Short redelivery, so a killed service's work is taken over within seconds.
	s.add("ranker", "ranker", "RANKER_ACK_WAIT=3s")
	s.add("composer-a", "composer", "COMPOSER_ACK_WAIT=5s", "COMPOSER_INPUTS_TIMEOUT=5s")
	s.add("composer-b", "composer", "COMPOSER_ACK_WAIT=5s", "COMPOSER_INPUTS_TIMEOUT=5s")
	s.add("archiver", "archiver", "ARCHIVER_ACK_WAIT=3s")
	for _, svc := range s.services {
		svc.p.waitOK(t, "http://"+svc.p.addr+"/readyz")
	}
	return s
}

func (s *soak) add(name, bin string, extra ...string) {
	svc := &soakService{name: name, bin: bin, extra: extra}
	svc.p = s.e.spawn(bin, extra...)
	s.services[name] = svc
}

// fault records a fault injected at began and healed now.
func (s *soak) fault(start, began time.Time, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, fmt.Sprintf("%6.1fs %s", began.Sub(start).Seconds(), what))
	s.windows = append(s.windows, [2]time.Time{began, time.Now()})
}

// chaos injects faults on the seeded schedule: every kind once per cycle, in a seeded order,
// every 1 to 4 seconds, each healed before the next (but the two of an overlap, injected at once),
// until deadline, and at least one whole cycle.
func (s *soak) chaos(deadline time.Time) {
	start := time.Now()
	for cycle := 0; cycle == 0 || time.Now().Before(deadline); cycle++ {
		order := slices.Clone(soakFaults)
		s.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, kind := range order {
			if cycle > 0 && !time.Now().Before(deadline) {
				return
			}
			time.Sleep(time.Duration(1000+s.rng.IntN(3000)) * time.Millisecond)
			s.inject(start, kind)
		}
	}
}

// inject injects one fault of kind and heals it.
func (s *soak) inject(start time.Time, kind string) {
	began := time.Now()
	switch kind {
	case "overlap":
		i := s.rng.IntN(len(soakOverlapping))
		j := (i + 1 + s.rng.IntN(len(soakOverlapping)-1)) % len(soakOverlapping) // another kind
		a, b := soakOverlapping[i], soakOverlapping[j]
		seeds := [2]uint64{s.rng.Uint64(), s.rng.Uint64()}
		var wg sync.WaitGroup
		for i, k := range []string{a, b} {
			wg.Go(func() { s.injectWith(start, rand.New(rand.NewPCG(seeds[i], uint64(i))), k) })
		}
		wg.Wait()
		s.fault(start, began, "overlap of "+a+" and "+b)
	default:
		s.injectWith(start, s.rng, kind)
	}
}

// injectWith injects one fault of kind, its choices drawn from rng.
func (s *soak) injectWith(start time.Time, rng *rand.Rand, kind string) {
	began := time.Now()
	switch kind {
	case "kill ranker":
		s.kill("ranker", rng)
		s.fault(start, began, "ranker killed (SIGKILL) and started again")
	case "kill composer":
		name := []string{"composer-a", "composer-b"}[rng.IntN(2)]
		s.kill(name, rng)
		s.fault(start, began, name+" killed (SIGKILL) and started again")
	case "kill archiver":
		s.kill("archiver", rng)
		s.fault(start, began, "archiver killed (SIGKILL) and started again")
	case "stop service":
		name := []string{"ranker", "composer-a", "composer-b", "archiver"}[rng.IntN(4)]
		s.mu.Lock()
		p := s.services[name].p
		s.mu.Unlock()
		d := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
		err := p.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(d)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		s.fault(start, began, fmt.Sprintf("%s stopped (SIGSTOP) for %s (%v)", name, d, errText(err)))
	case "restart nats":
		s.nsMu.Lock()
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		s.ns = startNATSAt(s.t, s.port, s.dir)
		s.nsMu.Unlock()
		s.fault(start, began, "NATS server restarted")
	case "freeze clickhouse":
		d := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
		if err := s.ch.Pause(); err != nil {
			s.t.Error(err)
			return
		}
		time.Sleep(d)
		if err := s.ch.Resume(); err != nil {
			s.t.Error(err)
		}
		s.fault(start, began, "ClickHouse frozen for "+d.String())
	case "delete durable":
		stream, durable := events.StreamEvaluations, events.ConsumerRanker
		switch rng.IntN(3) {
		case 1:
			stream, durable = events.StreamRounds, events.ConsumerComposer
		case 2:
			stream, durable = events.StreamPrompts, events.ConsumerArchiver
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.e.js.DeleteConsumer(ctx, stream, durable)
		cancel()
		s.fault(start, began, fmt.Sprintf("durable %s deleted (%v)", durable, errText(err)))
	case "drop table", "truncate table":
		q := map[string]string{"drop table": "DROP TABLE IF EXISTS evaluations", "truncate table": "TRUNCATE TABLE IF EXISTS evaluations"}[kind]
		s.evMu.Lock()
		err := s.storeExec(q)
		lost := false
		// A statement whose answer did not come in time may have run all the same (a DROP seen
		// by the ranker after its client gave up: one soak counted it undone and recounted the
		// executions it destroyed): counted as done, so those executions are not recounted.
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			s.tableFault, s.tableFaultInc = time.Now(), s.inc
			lost = s.floorInc < s.inc
			// The executions of a stream deleted before are lost now: the stream and the table
			// were their two copies.
			for exec, inc := range s.execInc {
				if _, gone := s.destroyed[exec]; inc < s.inc && !gone {
					s.destroyed[exec] = time.Now()
				}
			}
		}
		s.evMu.Unlock()
		settled := ""
		if lost {
			settled = "; " + s.settleLoss()
		}
		s.fault(start, began, fmt.Sprintf("%s (%v)%s", q, errText(err), settled))
	case "drop archive":
		s.evMu.Lock()
		err := s.storeExec("DROP TABLE IF EXISTS prompts")
		lost := (err == nil || errors.Is(err, context.DeadlineExceeded)) && s.archiveFloorInc < s.promptsInc // as for the evaluations' table
		if lost {
			s.archiveLost = s.promptsDeleted
		}
		s.evMu.Unlock()
		settled := ""
		if lost {
			settled = "; " + s.settleArchiveLoss()
		}
		s.fault(start, began, fmt.Sprintf("prompts table (the archive) dropped (%v)%s", errText(err), settled))
	case "delete EVALUATIONS":
		s.fault(start, began, "EVALUATIONS deleted once the ranker committed it, made again by the ranker: "+s.deleteEvaluations())
	case "delete ROUNDS", "delete PROMPTS":
		stream := strings.TrimPrefix(kind, "delete ")
		s.fault(start, began, stream+" deleted once every request was answered and archived, made again: "+s.deleteQuiet(stream))
	case "delete LEADERBOARDS":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.e.js.DeleteStream(ctx, events.StreamLeaderboards)
		cancel()
		s.fault(start, began, fmt.Sprintf("LEADERBOARDS deleted (%v)", errText(err)))
	case "hostile template":
		s.fault(start, began, "a template whose sections multiply pushed and asked for: "+s.askHostile(rng))
	case "poison":
		s.fault(start, began, "poison events: "+s.poison(rng))
	}
}

func errText(err error) string {
	if err == nil {
		return "done"
	}
	return err.Error()
}

// storeExec runs a statement on the soak's database as an operator would. Its error may be
// context.DeadlineExceeded with the statement run all the same (a DROP waiting for the table's
// lock on two loaded cores): its callers count that as done.
func (s *soak) storeExec(q string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{s.ch.Addr}, Auth: clickhouse.Auth{Database: "soak"}})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return conn.Exec(ctx, q)
}

// kill ends a service with SIGKILL and starts it again after up to two seconds.
func (s *soak) kill(name string, rng *rand.Rand) {
	s.mu.Lock()
	svc := s.services[name]
	p := svc.p
	s.mu.Unlock()
	_ = p.cmd.Process.Kill()
	err := <-p.done
	p.done <- err // the cleanup waits for it too
	time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
	next := s.e.spawn(svc.bin, svc.extra...)
	s.mu.Lock()
	svc.p = next
	s.mu.Unlock()
}

// caughtUp waits until a durable has settled everything its stream holds.
func (s *soak) caughtUp(stream, durable string, limit time.Duration) error {
	var last error
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := consumerInfo(ctx, s.e.js, stream, durable)
		var st *jetstream.StreamInfo
		if err == nil {
			var h jetstream.Stream
			if h, err = s.e.js.Stream(ctx, stream); err == nil {
				st = h.CachedInfo()
			}
		}
		cancel()
		if err == nil && info.AckFloor.Stream >= st.State.LastSeq && info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("%s at %d of %d", durable, info.AckFloor.Stream, st.State.LastSeq)
		}
	}
	return fmt.Errorf("not caught up within %s: %v", limit, last)
}

// remade waits until a deleted stream exists again (a service with MANAGE_STREAMS makes it).
func (s *soak) remade(stream string) error {
	var err error
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = s.e.js.Stream(ctx, stream)
		cancel()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s not made again within a minute: %v", stream, err)
}

// deleteEvaluations deletes EVALUATIONS once its current stream holds an evaluation and the
// ranker committed everything: the ranker has then seen this stream (one era per stream), and
// nothing acknowledged is lost with it. The orchestrators start new executions after it.
func (s *soak) deleteEvaluations() string {
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		s.evMu.Lock()
		has := len(s.evals) > 0 && s.evals[len(s.evals)-1].inc == s.inc
		s.evMu.Unlock()
		if has {
			break
		}
	}
	s.evalGate.Lock()
	defer s.evalGate.Unlock()
	if err := s.refilledSinceTableFault(); err != nil {
		s.t.Errorf("EVALUATIONS not deleted: %v", err)
		return err.Error()
	}
	if err := s.caughtUp(events.StreamEvaluations, events.ConsumerRanker, 60*time.Second); err != nil {
		s.t.Errorf("EVALUATIONS not deleted: %v", err)
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := s.e.js.DeleteStream(ctx, events.StreamEvaluations)
	cancel()
	if err != nil {
		return err.Error()
	}
	s.evMu.Lock()
	s.inc++
	s.evMu.Unlock()
	if err := s.remade(events.StreamEvaluations); err != nil {
		s.t.Error(err)
		return err.Error()
	}
	return "done"
}

// settleLoss is the operator after a table fault that lost the rows of a deleted EVALUATIONS: the
// ranker must name the loss (on its consumer, within 30 s: its check runs every 5 s) and wait for
// it; the operator accepts it with `podium store accept-loss`, and the ranker refills.
func (s *soak) settleLoss() string {
	l, out := s.acceptLoss(events.StreamEvaluations, events.ConsumerRanker, events.MetaStoreLoss, "the ranker")
	if l == nil {
		return out
	}
	s.evMu.Lock()
	s.floorInc = s.inc
	s.evMu.Unlock()
	return out
}

// settleArchiveLoss is settleLoss for the archive dropped while it held the records of a deleted
// PROMPTS: the archiver names the loss, the operator accepts it with `podium store accept-loss
// --archive`, and the archiver fills the table from the PROMPTS there is now.
func (s *soak) settleArchiveLoss() string {
	l, out := s.acceptLoss(events.StreamPrompts, events.ConsumerArchiver, events.MetaArchiveLoss, "the archiver", "--archive")
	if l == nil {
		return out
	}
	s.evMu.Lock()
	s.archiveFloorInc = s.promptsInc
	s.evMu.Unlock()
	return out
}

// acceptLoss waits (30 s) for the loss the durable's metadata names under key, and accepts it.
func (s *soak) acceptLoss(stream, durable, key, who string, flags ...string) (*events.StoreLoss, string) {
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cons, err := s.e.js.Consumer(ctx, stream, durable)
		cancel()
		if err != nil {
			continue
		}
		var l events.StoreLoss
		raw := cons.CachedInfo().Config.Metadata[key]
		if raw == "" || json.Unmarshal([]byte(raw), &l) != nil {
			continue
		}
		args := append(append([]string{"store", "accept-loss"}, flags...), "--lineage", l.Lineage, "--reason", "soak: the table lost the rows of a deleted "+stream)
		out, code := s.e.podium(s.t, nil, args...)
		if code != 0 {
			s.t.Errorf("podium %v: exit %d\n%s", args, code, out)
			return nil, "accept-loss failed"
		}
		return &l, fmt.Sprintf("%s named the loss of eras %d-%d (%d executions), accepted", who, l.FromEra, l.ToEra, len(l.Executions))
	}
	s.t.Errorf("the table lost the rows of a deleted %s and %s named no loss within 30 s", stream, who)
	return nil, "no loss named"
}

// refilledSinceTableFault waits, when the table was dropped or truncated in this stream's
// incarnation, until the ranker has had time to find it (its check every 5 s) and is ready again:
// refilled from the stream. Deleting the stream before that would lose the rows the table lost
// with their last copy, as an operator who wants nothing lost would not.
func (s *soak) refilledSinceTableFault() error {
	s.evMu.Lock()
	at, inc, current := s.tableFault, s.tableFaultInc, s.inc
	s.evMu.Unlock()
	if at.IsZero() || inc != current {
		return nil
	}
	time.Sleep(time.Until(at.Add(8 * time.Second)))
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		s.mu.Lock()
		p := s.services["ranker"].p
		s.mu.Unlock()
		if code, _ := readiness(p); code == http.StatusOK {
			return nil
		}
	}
	return errors.New("the ranker was not ready within 90 s of the table's fault")
}

// deleteQuiet deletes ROUNDS or PROMPTS once every request was answered and every answer
// archived: nothing acknowledged is lost with it.
func (s *soak) deleteQuiet(stream string) string {
	s.reqGate.Lock()
	defer s.reqGate.Unlock()
	for _, c := range [][2]string{{events.StreamRounds, events.ConsumerComposer}, {events.StreamPrompts, events.ConsumerArchiver}} {
		if err := s.caughtUp(c[0], c[1], 60*time.Second); err != nil {
			s.t.Errorf("%s not deleted: %v", stream, err)
			return err.Error()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := s.e.js.DeleteStream(ctx, stream)
	cancel()
	if err != nil {
		return err.Error()
	}
	if stream == events.StreamPrompts {
		s.evMu.Lock()
		s.promptsDeleted = time.Now()
		s.promptsInc++
		s.evMu.Unlock()
	}
	if err := s.remade(stream); err != nil {
		s.t.Error(err)
		return err.Error()
	}
	return "done"
}

// askHostile pushes a template of eight nested history sections (valid Mustache, a render of
// rounds^8 steps) and asks for it in round 10 of an execution of its own with nine rounds of
// history: the answer must be budget_exceeded, within the composer's limits.
func (s *soak) askHostile(rng *rand.Rand) string {
	dir := filepath.Join(s.dir, fmt.Sprintf("hostile-%d", rng.Uint64()))
	if err := os.MkdirAll(filepath.Join(dir, "hostile"), 0o755); err != nil {
		return err.Error()
	}
	bomb := "Round {{round_number}}:" + strings.Repeat("{{#history}}", 8) + "{{round_number}}" + strings.Repeat("{{/history}}", 8) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "hostile", "prompt.mustache"), []byte(bomb), 0o644); err != nil {
		return err.Error()
	}
	if out, code := s.e.podium(s.t, nil, "templates", "push", filepath.Join(dir, "hostile")); code != 0 {
		return fmt.Sprintf("push refused (exit %d): %s", code, strings.TrimSpace(out))
	}
	// Composers hear of a push through the registry's watch: asked before, one answers
	// unknown_template. An author waits until both serve it, as the registry's tests do.
	for _, name := range []string{"composer-a", "composer-b"} {
		served := false
		for end := time.Now().Add(30 * time.Second); !served && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			s.mu.Lock()
			p := s.services[name].p
			s.mu.Unlock()
			served = renders(p, `{"execution_id":"probe","team_id":"p","team_name":"P","round_number":1,"user_prompt":"Go.","template":"hostile:latest"}`)
		}
		if !served {
			return name + " did not serve the pushed template within 30 s"
		}
	}
	s.mu.Lock()
	s.hostile++
	exec := fmt.Sprintf("hostile-%d", s.hostile)
	s.mu.Unlock()
	for round := 1; round <= 9; round++ {
		id := fmt.Sprintf("ev-%s-%d", exec, round)
		s.publishEvaluation(id, id, evaluation(exec, "t0", "Team t0", round, float64(round), fmt.Sprintf("answer %d", round), t0.Add(time.Duration(round)*time.Hour)))
	}
	rounds := 20
	id := fmt.Sprintf("req-%s", exec)
	s.publishRequest(id, events.RoundRequested{ExecutionID: exec, TeamID: "t0", TeamName: "Team t0", RoundNumber: 10,
		UserPrompt: "Go.", Template: "hostile:latest", Limits: events.Limits{HistoryRounds: &rounds}}, t0.Add(10*time.Hour), "hostile")
	s.awaitAnswers(exec, map[string]string{"t0": id}, 20*time.Second)
	return exec
}

// renders reports whether a composer answers a render of body 200 (false while it restarts).
func renders(p *proc, body string) bool {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Post("http://"+p.addr+"/v1/render", "application/json", strings.NewReader(body))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// poison publishes an evaluation that is not JSON (dead-lettered by the ranker) and a request
// without a round or a prompt on a subject of an execution of its own (answered invalid_request,
// under its own id, and dead-lettered).
func (s *soak) poison(rng *rand.Rand) string {
	n := rng.Uint64()
	exec := fmt.Sprintf("poison-%d", n)
	s.evalGate.RLock()
	_, errE := s.publish(events.EvaluationSubject(exec, "t0"), fmt.Sprintf("poison-ev-%d", n), []byte(`{"specversion":"1.0","id":`))
	s.evalGate.RUnlock()
	id := fmt.Sprintf("poison-req-%d", n)
	body, errR := events.Marshal(id, "orchestrator/soak", events.TypeRoundRequested, t0, map[string]any{"execution_id": exec, "team_id": "t0"})
	if errR == nil {
		s.reqGate.RLock()
		_, errR = s.publish(events.RoundSubject(exec, "t0"), id, body)
		s.reqGate.RUnlock()
	}
	if errE != nil || errR != nil {
		s.t.Errorf("poison not published: %v %v", errE, errR)
		return "not published"
	}
	s.requests.Store(id, soakRequest{exec: exec, team: "t0", kind: "poison", at: time.Now()})
	s.published.Add(1)
	s.awaitAnswers(exec, map[string]string{"t0": id}, 20*time.Second)
	return exec
}

// publish sends a message until JetStream acknowledges it (two minutes at most).
func (s *soak) publish(subject, msgID string, body []byte) (*jetstream.PubAck, error) {
	end := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ack, err := events.Publish(ctx, s.e.js, subject, msgID, body)
		cancel()
		if err == nil {
			return ack, nil
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("publish %s: %w", msgID, err)
		}
		time.Sleep(50 * time.Millisecond) // the pause between two tries of a publish
	}
}

// publishRequest publishes a request, noting it with the last evaluation acknowledged before it.
func (s *soak) publishRequest(id string, rr events.RoundRequested, at time.Time, kind string) bool {
	body, err := events.Marshal(id, "orchestrator/soak", events.TypeRoundRequested, at, rr)
	if err != nil {
		s.t.Error(err)
		return false
	}
	s.evMu.Lock()
	req := soakRequest{exec: rr.ExecutionID, team: rr.TeamID, round: rr.RoundNumber, inc: s.inc, kind: kind, at: time.Now()}
	if n := len(s.evals); n > 0 {
		req.inc, req.seq = s.evals[n-1].inc, s.evals[n-1].seq
	}
	s.evMu.Unlock()
	s.reqGate.RLock()
	_, err = s.publish(events.RoundSubject(rr.ExecutionID, rr.TeamID), id, body)
	s.reqGate.RUnlock()
	if err != nil {
		s.t.Error(err)
		return false
	}
	s.requests.Store(id, req)
	s.published.Add(1)
	return true
}

// orchestrate plays executions of soakRounds rounds, one after the other, until the schedule is
// done, as an orchestrator does: each round, every team's request, then (once answered, or after a
// while) every team's evaluation; now and then an evaluation is replayed (the same event id stored
// again) or re-evaluated (a new id, a later evaluated_at, another score). An execution whose
// stream was deleted is left for a new one.
func (s *soak) orchestrate(name string, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed>>1|1))
	for n := 0; !s.done(); n++ {
		exec := fmt.Sprintf("%s-%d", name, n)
		for round := 1; round <= soakRounds && !s.done(); round++ {
			if !s.playRound(rng, exec, round) {
				break
			}
		}
	}
}

// done reports whether the schedule is done.
func (s *soak) done() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// playRound plays one round of an execution; false when the execution cannot go on.
func (s *soak) playRound(rng *rand.Rand, exec string, round int) bool {
	at := t0.Add(time.Duration(round) * time.Hour)
	ids := map[string]string{}
	for tm := range soakTeams {
		team := fmt.Sprintf("t%d", tm)
		id := fmt.Sprintf("req-%s-%s-%d", exec, team, round)
		rr := events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: round, MaxRounds: soakRounds,
			UserPrompt: "Design a protocol that survives the failures it will meet."}
		if !s.publishRequest(id, rr, at, "") {
			return false
		}
		ids[team] = id
	}
	s.awaitAnswers(exec, ids, 20*time.Second)
	for tm := range soakTeams {
		team := fmt.Sprintf("t%d", tm)
		at = at.Add(time.Second)
		id := fmt.Sprintf("ev-%s-%s-%d", exec, team, round)
		ev := evaluation(exec, team, "Team "+team, round, float64(rng.IntN(10000))/100, soakText(rng, exec, team, round), at)
		if !s.publishEvaluation(id, id, ev) {
			return false
		}
		if rng.IntN(10) == 0 { // a replay: the same event stored again, which must count once
			s.publishEvaluation(id, id+"#replay", ev)
		}
		if rng.IntN(10) == 0 { // a re-evaluation: the newest evaluation of the round counts
			at = at.Add(time.Second)
			re := evaluation(exec, team, "Team "+team, round, float64(rng.IntN(10000))/100, soakText(rng, exec, team, round), at)
			s.publishEvaluation(id+"-re", id+"-re", re)
		}
	}
	return true
}

// soakText is an answer as a model writes one: a few KiB of text that repeats no other's.
func soakText(rng *rand.Rand, exec, team string, round int) string {
	words := []string{"quorum", "leader", "lease", "epoch", "replica", "commit", "snapshot", "fence", "term", "log", "heartbeat", "partition"}
	var b strings.Builder
	fmt.Fprintf(&b, "Answer of %s in %s, round %d.\n", team, exec, round)
	for b.Len() < 2000+rng.IntN(2000) {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(" \n"[rng.IntN(2)])
	}
	return b.String()
}

// publishEvaluation publishes an evaluation and notes it acknowledged, with where; false when
// the execution's evaluations would span two EVALUATIONS streams (its stream was deleted).
func (s *soak) publishEvaluation(id, msgID string, ev events.EvaluationCompleted) bool {
	body, err := events.Marshal(id, "orchestrator/soak", events.TypeEvaluationCompleted, ev.EvaluatedAt, ev)
	if err != nil {
		s.t.Error(err)
		return false
	}
	s.evalGate.RLock()
	defer s.evalGate.RUnlock()
	s.evMu.Lock()
	inc, seen := s.execInc[ev.ExecutionID]
	current := s.inc
	s.evMu.Unlock()
	if seen && inc != current {
		return false
	}
	ack, err := s.publish(events.EvaluationSubject(ev.ExecutionID, ev.TeamID), msgID, body)
	if err != nil {
		s.t.Error(err)
		return false
	}
	s.evMu.Lock()
	defer s.evMu.Unlock()
	s.execInc[ev.ExecutionID] = current
	// A duplicate is a try whose ack was lost: the stream stored the message then, at this sequence.
	s.evals = append(s.evals, ackedEval{p: published{id: id, ev: ev}, inc: current, seq: ack.Sequence})
	return true
}

// awaitAnswers waits until each team's latest answer is its request's, or the limit passes.
func (s *soak) awaitAnswers(exec string, ids map[string]string, limit time.Duration) {
	pending := slices.Sorted(maps.Keys(ids))
	for end := time.Now().Add(limit); len(pending) > 0 && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		st, err := s.e.js.Stream(context.Background(), events.StreamPrompts)
		if err != nil {
			continue
		}
		pending = slices.DeleteFunc(pending, func(team string) bool {
			for _, kind := range []string{"composed", "failed"} {
				msg, err := st.GetLastMsgForSubject(context.Background(), "prompt."+kind+"."+exec+"."+team)
				if err != nil {
					continue
				}
				var d struct {
					RequestID string `json:"request_id"`
				}
				var env events.Envelope
				if json.Unmarshal(msg.Data, &env) == nil && json.Unmarshal(env.Data, &d) == nil && d.RequestID == ids[team] {
					// Kept: a PROMPTS deleted later and an archive dropped after it lose it.
					s.seen.Store(env.ID, record{body: msg.Data, at: msg.Time})
					return true
				}
			}
			return false
		})
	}
	s.answered.Add(int64(len(ids) - len(pending)))
	s.late.Add(int64(len(pending)))
}

// probe reads every service's readiness, what its replicas settled, and both consumers every
// 500 ms until stop, and notes each time a service was ready while its consumer held pending work
// and none of it was done (no ack floor moved, no message settled) for longer than soakIdleLimit.
func (s *soak) probe(stop <-chan struct{}) {
	type progress struct {
		floor   uint64
		settled float64
		since   time.Time // when work was last done, or nothing was pending
	}
	consumers := map[string][2]string{"ranker": {events.StreamEvaluations, events.ConsumerRanker}, "composer": {events.StreamRounds, events.ConsumerComposer},
		"archiver": {events.StreamPrompts, events.ConsumerArchiver}}
	seen := map[string]*progress{}
	wasReady := map[string]time.Time{}
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
		now := time.Now()
		ready := map[string]bool{} // by kind: any replica ready
		s.mu.Lock()
		procs := map[string]*proc{}
		for name, svc := range s.services {
			procs[name] = svc.p
		}
		s.mu.Unlock()
		for name, p := range procs {
			ok := false
			if resp, err := client.Get("http://" + p.addr + "/readyz"); err == nil {
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
			}
			kind := strings.Split(name, "-")[0]
			ready[kind] = ready[kind] || ok
			if ok {
				if since, down := wasReady[name]; down && !since.IsZero() {
					s.mu.Lock()
					s.unready[name] = max(s.unready[name], now.Sub(since))
					s.mu.Unlock()
				}
				wasReady[name] = time.Time{}
			} else if wasReady[name].IsZero() {
				wasReady[name] = now
			}
		}
		settled := map[string]float64{} // by kind: messages settled by its live replicas so far
		for name, p := range procs {
			settled[strings.Split(name, "-")[0]] += settledOf(client, p, strings.Split(name, "-")[0])
		}
		for kind, c := range consumers {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := consumerInfo(ctx, s.e.js, c[0], c[1])
			cancel()
			if err != nil {
				continue // NATS restarting, the durable being made again
			}
			// Work is done while the floor moves or a replica settles messages (a request answered
			// inputs_not_ready while the ranker refills is work done too).
			pg := seen[kind]
			if pg == nil || info.AckFloor.Stream != pg.floor || info.NumPending+uint64(info.NumAckPending) == 0 || settled[kind] != pg.settled {
				seen[kind] = &progress{floor: info.AckFloor.Stream, settled: settled[kind], since: now}
				continue
			}
			if ready[kind] && now.Sub(pg.since) > soakIdleLimit {
				s.mu.Lock()
				s.idle = append(s.idle, fmt.Sprintf("%s ready with %d pending and %d in hand, ack floor at %d for %s", kind,
					info.NumPending, info.NumAckPending, pg.floor, now.Sub(pg.since).Round(time.Second)))
				s.mu.Unlock()
				pg.since = now // one line per stall
			}
		}
	}
}

// settledOf reads how many messages a service process has settled (its
// <kind>_messages_settled_total, all outcomes); 0 when it does not answer.
func settledOf(client *http.Client, p *proc, kind string) float64 {
	resp, err := client.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	total := 0.0
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, kind+"_messages_settled_total{") {
			continue
		}
		if f := strings.Fields(line); len(f) == 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			total += v
		}
	}
	return total
}

// waitQuiet waits until every service is ready and has done all the work there is.
func (s *soak) waitQuiet() {
	t := s.t
	s.mu.Lock()
	procs := []*proc{}
	for _, svc := range s.services {
		procs = append(procs, svc.p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		waitReadiness(t, p, http.StatusOK, 90*time.Second)
	}
	testenv.WaitFor(t, 120*time.Second, "every evaluation committed, every request settled, every record archived", func() (bool, string) {
		var why []string
		for _, c := range [][2]string{{events.StreamEvaluations, events.ConsumerRanker}, {events.StreamRounds, events.ConsumerComposer}, {events.StreamPrompts, events.ConsumerArchiver}} {
			info, err := consumerInfo(t.Context(), s.e.js, c[0], c[1])
			if err != nil {
				return false, err.Error()
			}
			last := streamState(t, s.e.js, c[0]).LastSeq
			if info.AckFloor.Stream < last || info.NumAckPending > 0 || info.NumPending > 0 {
				why = append(why, fmt.Sprintf("%s: ack floor %d of %d, %d in hand, %d pending", c[1], info.AckFloor.Stream, last, info.NumAckPending, info.NumPending))
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
}

// check verifies what the soak promises (see TestChaosSoak) and logs its figures.
func (s *soak) check() {
	t := s.t
	s.evMu.Lock()
	evals := slices.Clone(s.evals)
	destroyed := maps.Clone(s.destroyed)
	archiveLost := s.archiveLost
	s.evMu.Unlock()
	// The oracle: by execution, what the orchestrators saw acknowledged, in the order of the
	// stream (its incarnation, its sequence).
	slices.SortFunc(evals, func(a, b ackedEval) int { return cmp.Or(cmp.Compare(a.inc, b.inc), cmp.Compare(a.seq, b.seq)) })
	byExec := map[string][]ackedEval{}
	for _, a := range evals {
		byExec[a.p.ev.ExecutionID] = append(byExec[a.p.ev.ExecutionID], a)
	}
	// recount is the truth of an execution as of a position: the first copy of each id among the
	// evaluations at or before it, reduced by truth.
	recount := func(exec string, inc int, seq uint64) ([]events.LeaderboardRow, map[string][]published) {
		first := map[string]published{}
		for _, a := range byExec[exec] {
			if a.inc > inc || a.inc == inc && a.seq > seq {
				break
			}
			if _, ok := first[a.p.id]; !ok {
				first[a.p.id] = a.p
			}
		}
		boards, latest := truth(first, false)
		return boards[exec], latest[exec]
	}
	s.mu.Lock()
	ranker := s.services["ranker"].p
	s.mu.Unlock()
	for exec := range byExec {
		if _, gone := destroyed[exec]; gone {
			continue
		}
		want, _ := recount(exec, math.MaxInt, math.MaxUint64)
		// The ranker's reads are anchored (chstore/view.go): a TRUNCATE in the schedule's last
		// seconds is answered 503 until the store is whole again, never with a short board. So
		// the check waits for a 200 (at most 60 s), and the first 200 must be the recount.
		var got leaderboard
		var code int
		deadline := time.Now().Add(60 * time.Second)
		for {
			got = leaderboard{}
			code = ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &got)
			if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if code != http.StatusOK {
			t.Errorf("%s leaderboard: status %d", exec, code)
		}
		if diff := gocmp.Diff(want, got.Teams, emptyRows); diff != "" {
			t.Errorf("%s leaderboard (-recount of what was acknowledged +ranker):\n%s", exec, diff)
		}
	}

	// Every answer: PROMPTS now, and the archive for the PROMPTS streams deleted before.
	execs := map[string]bool{}
	requests := map[string]soakRequest{}
	s.requests.Range(func(k, v any) bool {
		requests[k.(string)] = v.(soakRequest)
		execs[v.(soakRequest).exec] = true
		return true
	})
	recorded := map[string][]byte{} // PROMPTS' records by event id, the first copy
	stored := map[string]time.Time{}
	perRequest := map[string]int{} // PROMPTS' records of each request
	_ = readStream(t, s.e.js, events.StreamPrompts, func(msg jetstream.Msg, _ uint64) {
		var env events.Envelope
		if err := json.Unmarshal(msg.Data(), &env); err != nil {
			t.Errorf("PROMPTS: %v", err)
			return
		}
		if _, ok := recorded[env.ID]; !ok {
			recorded[env.ID] = msg.Data()
			md, _ := msg.Metadata()
			stored[env.ID] = md.Timestamp
		}
		var d struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(env.Data, &d)
		perRequest[d.RequestID]++
	})
	answers := s.checkArchive(recorded, stored, execs)
	kept := map[string]bool{} // executions with records in PROMPTS or the archive: verify reads them
	for _, rec := range answers {
		var env events.Envelope
		if json.Unmarshal(rec.body, &env) == nil && env.Type == events.TypePromptComposed {
			var d struct {
				ExecutionID string `json:"execution_id"`
			}
			_ = json.Unmarshal(env.Data, &d)
			kept[d.ExecutionID] = true
		}
	}
	s.seen.Range(func(k, v any) bool {
		if _, ok := answers[k.(string)]; !ok {
			answers[k.(string)] = v.(record) // lost with a PROMPTS deleted and the archive dropped after
		}
		return true
	})
	composed, failed, explained, unexplained, lostExecs := 0, map[string]int{}, 0, 0, 0
	answered := map[string]int{}
	for _, rec := range answers {
		var env events.Envelope
		if err := json.Unmarshal(rec.body, &env); err != nil {
			t.Errorf("a record: %v", err)
			continue
		}
		if env.Type == events.TypePromptFailed {
			var pf events.PromptFailed
			_ = json.Unmarshal(env.Data, &pf)
			answered[pf.RequestID]++
			failed[string(pf.Code)]++
			req, ok := requests[pf.RequestID]
			switch {
			case !ok:
				t.Errorf("prompt.failed %s answers no request acknowledged: %+v", env.ID, pf)
			case pf.ExecutionID != req.exec || pf.TeamID != req.team || req.kind != "poison" && pf.RoundNumber != req.round:
				t.Errorf("prompt.failed of %s names %s/%s round %d, the request %s/%s round %d", pf.RequestID, pf.ExecutionID, pf.TeamID, pf.RoundNumber, req.exec, req.team, req.round)
			case req.kind == "poison":
				if pf.Code != events.CodeInvalidRequest {
					t.Errorf("poison request %s answered %s, want invalid_request", pf.RequestID, pf.Code)
				}
			case req.kind == "hostile":
				if pf.Code != events.CodeBudgetExceeded {
					t.Errorf("the hostile template's request %s answered %s (%s), want budget_exceeded", pf.RequestID, pf.Code, pf.Message)
				}
			case pf.Retryable && (pf.Code == events.CodeInputsNotReady || pf.Code == events.CodeStoreUnavailable):
				if s.duringFault(rec.at) {
					explained++
				} else {
					unexplained++
					t.Errorf("%s failed %s at %s, with no fault within %s before: %s", pf.RequestID, pf.Code, rec.at.Format(time.RFC3339Nano), soakExplains, pf.Message)
				}
			default:
				t.Errorf("%s failed %s (retryable %v): %s", pf.RequestID, pf.Code, pf.Retryable, pf.Message)
			}
			continue
		}
		var pc events.PromptComposed
		if err := json.Unmarshal(env.Data, &pc); err != nil {
			t.Errorf("a record: %v", err)
			continue
		}
		answered[pc.RequestID]++
		composed++
		req, ok := requests[pc.RequestID]
		switch {
		case !ok:
			t.Errorf("prompt.composed %s answers no request acknowledged", pc.RequestID)
			continue
		case req.kind != "":
			t.Errorf("the %s request %s was composed", req.kind, pc.RequestID)
			continue
		case pc.ExecutionID != req.exec || pc.TeamID != req.team || pc.RoundNumber != req.round:
			t.Errorf("the prompt of %s names %s/%s round %d, the request %s/%s round %d", pc.RequestID, pc.ExecutionID, pc.TeamID, pc.RoundNumber, req.exec, req.team, req.round)
			continue
		}
		era, seq := int(pc.Inputs.EvaluationsEra), pc.Inputs.EvaluationsSeq
		if era < req.inc || era == req.inc && seq < req.seq {
			t.Errorf("the prompt of %s is composed as of era %d sequence %d, before era %d sequence %d acknowledged before its request", pc.RequestID, era, seq, req.inc, req.seq)
		}
		if gone, ok := destroyed[pc.ExecutionID]; ok && !rec.at.Before(gone) {
			lostExecs++
			continue // read after its rows were gone with its stream and its table: no truth to hold it to
		}
		board, latest := recount(pc.ExecutionID, era, seq)
		if pc.RoundNumber <= 1 {
			board = nil // round 1 gets no ranking (docs/prompts.md)
		}
		if diff := gocmp.Diff(board, pc.Inputs.Leaderboard, emptyRows); diff != "" {
			t.Errorf("the prompt of %s (era %d, sequence %d) carries another board than the recount (-recount +prompt):\n%s", pc.RequestID, era, seq, diff)
		}
		var wantRounds []int
		var wantIDs []string
		for _, p := range latest[pc.TeamID] {
			if p.ev.RoundNumber < pc.RoundNumber {
				wantRounds, wantIDs = append(wantRounds, p.ev.RoundNumber), append(wantIDs, p.id)
			}
		}
		slices.Sort(wantRounds)
		slices.Sort(wantIDs)
		gotRounds, gotIDs := slices.Sorted(slices.Values(pc.Inputs.HistoryRounds)), slices.Sorted(slices.Values(pc.Inputs.EvaluationIDs))
		if !slices.Equal(wantRounds, gotRounds) || !slices.Equal(wantIDs, gotIDs) {
			t.Errorf("the prompt of %s (era %d, sequence %d) carries history %v %v, the recount %v %v", pc.RequestID, era, seq, gotRounds, gotIDs, wantRounds, wantIDs)
		}
	}
	missing, twice, lostAnswers := 0, 0, 0
	for id, req := range requests {
		switch {
		case answered[id] == 0 && req.at.Before(archiveLost):
			lostAnswers++ // answered in a PROMPTS deleted since, then the archive was dropped
		case answered[id] == 0:
			missing++
			t.Errorf("request %s acknowledged and never answered", id)
		case answered[id] > 1 || perRequest[id] > 1:
			twice++
			t.Errorf("request %s answered %d times", id, max(answered[id], perRequest[id]))
		}
	}
	if retryable := explained + unexplained; float64(retryable) > soakMaxFailures*float64(len(requests)) {
		t.Errorf("%d of %d requests failed retryably, more than %.0f%%", retryable, len(requests), 100*soakMaxFailures)
	}
	// podium prompts verify re-renders every prompt of an execution from the store; a long soak
	// plays hundreds of executions, of which a seeded sample of soakVerified is verified (every
	// prompt's board was recounted above).
	var sample []string
	for exec := range byExec {
		if _, gone := destroyed[exec]; !gone && kept[exec] && !strings.HasPrefix(exec, "hostile-") {
			sample = append(sample, exec)
		}
	}
	slices.Sort(sample)
	rng := rand.New(rand.NewPCG(uint64(len(sample)), 7))
	rng.Shuffle(len(sample), func(i, j int) { sample[i], sample[j] = sample[j], sample[i] })
	for _, exec := range sample[:min(len(sample), soakVerified)] {
		// A read refused because a fault's refill was still under way ("try again": the store
		// changed while it was read) is asked again while it lasts; any other outcome counts.
		var out string
		var code int
		for range 30 {
			if out, code = s.e.podium(t, nil, "prompts", "verify", "--all", "--execution", exec); code == 0 || !strings.Contains(out, "try again") {
				break
			}
			time.Sleep(time.Second)
		}
		if code != 0 {
			t.Errorf("podium prompts verify --all --execution %s: exit %d\n%s", exec, code, out)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, line := range s.idle {
		t.Errorf("probe log: %s", line)
	}
	t.Logf("faults injected (%d):\n  %s", len(s.faults), strings.Join(s.faults, "\n  "))
	t.Logf("%d requests acknowledged: %d prompt.composed, prompt.failed %v (retryable: %d, each within %s of a fault), %d unanswered, %d answered twice, %d whose answers were lost with PROMPTS and the archive; %d answered within the orchestrators' 20 s wait, %d later",
		s.published.Load(), composed, failed, explained, soakExplains, missing, twice, lostAnswers, s.answered.Load(), s.late.Load())
	t.Logf("%d evaluations acknowledged over %d executions; %d executions lost with their stream and their table (%d of their prompts read after it, not recounted); longest unready spell per service: %v",
		len(evals), len(byExec), len(destroyed), lostExecs, s.unready)
}

// emptyRows takes an empty board and a missing one for the same.
var emptyRows = gocmp.Comparer(func(a, b []events.LeaderboardRow) bool {
	return gocmp.Equal(a, b) || len(a) == 0 && len(b) == 0
})

// duringFault reports whether at lies within a fault, or soakExplains after one healed.
func (s *soak) duringFault(at time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.windows {
		if !at.Before(w[0]) && !at.After(w[1].Add(soakExplains)) {
			return true
		}
	}
	return false
}

// checkArchive compares the prompts archive with PROMPTS: every record of the stream archived
// once, byte for byte; the others of the PROMPTS streams deleted before. It returns every
// record, by event id: the answers.
func (s *soak) checkArchive(recorded map[string][]byte, stored map[string]time.Time, execs map[string]bool) map[string]record {
	t := s.t
	st, err := chstore.Open(t.Context(), chstore.Config{Addrs: []string{s.ch.Addr}, Database: "soak"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	all := map[string]record{}
	for id, body := range recorded {
		all[id] = record{body: body, at: stored[id]}
	}
	archived, before := 0, 0
	for exec := range execs {
		rows, err := st.ArchivedPrompts(t.Context(), chstore.PromptFilter{ExecutionID: exec})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			archived++
			want, ok := recorded[r.EventID]
			switch {
			case ok && !bytes.Equal(want, r.Body):
				t.Errorf("archived record %s of %s (PROMPTS sequence %d) is not PROMPTS' record", r.EventID, exec, r.Seq)
			case !ok:
				before++ // of a PROMPTS stream deleted since
				all[r.EventID] = record{body: r.Body, at: r.Stored}
			}
		}
	}
	if archived-before != len(recorded) {
		t.Errorf("the archive holds %d of PROMPTS' %d records", archived-before, len(recorded))
	}
	t.Logf("the archive holds every one of PROMPTS' %d records once, byte for byte, and %d of the PROMPTS streams deleted before", archived-before, before)
	return all
}

// readStream hands fn every message of a stream, in order.
func readStream(t *testing.T, js jetstream.JetStream, stream string, fn func(jetstream.Msg, uint64)) error {
	t.Helper()
	cons, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last := streamState(t, js, stream).LastSeq
	for seq := uint64(0); seq < last; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			md, _ := msg.Metadata()
			seq = md.Sequence.Stream
			fn(msg, seq)
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("%s: nothing read after sequence %d of %d", stream, seq, last)
		}
	}
	return nil
}
