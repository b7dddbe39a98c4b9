// Package e2e runs the real ranker and composer binaries against a real JetStream server and a
// real ClickHouse server, and talks to them only as an orchestrator would: NATS and HTTP.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// bins holds the binaries built once for the package run.
var bins struct {
	dir string
	err error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "podium-e2e-bin-")
	if err == nil {
		// -buildvcs=auto: the binaries say the commit they were built from (--version), whatever
		// GOFLAGS says.
		args := []string{"build", "-buildvcs=auto", "-o", dir}
		if os.Getenv("PODIUM_E2E_RACE") != "" {
			args = append(args, "-race") // binaries that report data races in their logs and exit 66
		}
		args = append(args, "github.com/podium-llm/podium/cmd/ranker", "github.com/podium-llm/podium/cmd/composer", "github.com/podium-llm/podium/cmd/podium",
			"github.com/podium-llm/podium/cmd/console", "github.com/podium-llm/podium/cmd/archiver", servers.NATSServerPackage)
		out, buildErr := exec.Command("go", args...).CombinedOutput()
		if buildErr != nil {
			err = fmt.Errorf("go build: %v\n%s", buildErr, out)
		}
	}
	bins.dir, bins.err = dir, err
	code := testenv.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one pipeline under test: its own JetStream server and ClickHouse database.
type env struct {
	t        testing.TB
	ns       *server.Server
	natsURL  string // the servers' URLs where ns is not one in this process (a cluster of processes)
	nc       *nats.Conn
	js       jetstream.JetStream
	chAddr   string
	database string
	extra    []string // settings every service of this env gets (a replicated store)
}

func newEnv(t testing.TB) *env {
	t.Helper()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	ns := testenv.NATS(t)
	nc, js := testenv.JetStream(t, ns)
	addr, db := testenv.Database(t)
	return &env{t: t, ns: ns, nc: nc, js: js, chAddr: addr, database: db}
}

// proc is a running service binary.
type proc struct {
	name string
	cmd  *exec.Cmd
	addr string
	logs *syncBuffer
	done chan error
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// nextPort hands out HTTP ports of the services. They come from 20000-29999, below the
// kernel's ephemeral range (32768 and up), so an outgoing connection of a test running in
// parallel cannot take a port between freeAddr checking it and the service binding it; the
// process id spreads packages run at once over the range.
var nextPort atomic.Int32

func freeAddr(t testing.TB) string {
	t.Helper()
	nextPort.CompareAndSwap(0, int32(20000+os.Getpid()%500*20))
	for range 10000 {
		port := 20000 + (nextPort.Add(1)-20000)%10000
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken by another process: try the next
		}
		l.Close()
		return l.Addr().String()
	}
	t.Fatal("no free port in 20000-29999")
	return ""
}

// natsURLs is NATS_URL for the services and the CLI.
func (e *env) natsURLs() string {
	if e.natsURL != "" {
		return e.natsURL
	}
	return e.ns.ClientURL()
}

// baseEnv is the configuration every service of e gets; extra entries override it.
func (e *env) baseEnv(extra ...string) []string {
	return append([]string{
		"PATH=" + os.Getenv("PATH"),
		"NATS_URL=" + e.natsURLs(),
		"CLICKHOUSE_ADDR=" + e.chAddr,
		"CLICKHOUSE_DATABASE=" + e.database,
		"LOG_LEVEL=debug",
	}, append(slices.Clone(e.extra), extra...)...)
}

// start runs a service binary and waits until /readyz says 200.
func (e *env) start(name string, extra ...string) *proc {
	e.t.Helper()
	p := e.spawn(name, extra...)
	p.waitOK(e.t, "http://"+p.addr+"/readyz")
	return p
}

// waitOK waits until url (served by p) answers 200, and fails the test if p exits first.
func (p *proc) waitOK(t testing.TB, url string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, p.name+" "+url+" 200", func() (bool, string) {
		seen := "no answer"
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true, ""
			}
			seen = resp.Status
		}
		select {
		case err := <-p.done:
			p.done <- err // the cleanup waits for it too
			t.Fatalf("%s exited at start: %v\n%s", p.name, err, p.logs)
		default:
		}
		return false, seen // the cleanup logs p's output when the test failed
	})
}

// spawn runs a service binary without waiting for it; it is killed when the test ends.
func (e *env) spawn(name string, extra ...string) *proc {
	e.t.Helper()
	addr := freeAddr(e.t)
	p := &proc{name: name, addr: addr, logs: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(filepath.Join(bins.dir, name))
	p.cmd.Env = e.baseEnv(append([]string{"HTTP_ADDR=" + addr, "CONSOLE_ADDR=" + addr}, extra...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	e.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
		if strings.Contains(p.logs.String(), "WARNING: DATA RACE") {
			e.t.Errorf("%s reported a data race (built with PODIUM_E2E_RACE)", name)
		}
		if e.t.Failed() {
			e.t.Logf("%s logs:\n%s", name, p.logs)
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit error and how long the process took.
func (p *proc) stop(t testing.TB, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		return time.Since(start), err
	case <-time.After(limit):
		t.Fatalf("%s did not exit within %s of SIGTERM\n%s", p.name, limit, p.logs)
		return 0, nil
	}
}

// getJSON fetches an API path of p into v and returns the status.
func (p *proc) getJSON(t testing.TB, path string, v any) int {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

// metric returns the value of one series on p's /metrics, 0 when absent.
func (p *proc) metric(t testing.TB, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// publish sends a CloudEvent as an orchestrator would.
// It returns the stream sequence the event was stored at.
func (e *env) publish(subject, id, eventType string, at time.Time, data any) uint64 {
	e.t.Helper()
	body, err := events.Marshal(id, "orchestrator/test", eventType, at, data)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.publishRaw(subject, id, body)
}

// publishRaw sends bytes as they are, for bad input, and returns their stream sequence.
func (e *env) publishRaw(subject, id string, body []byte) uint64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := events.Publish(ctx, e.js, subject, id, body)
	if err != nil {
		e.t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// evaluation builds an evaluation.completed data.
func evaluation(exec, team, name string, round int, score float64, content string, at time.Time) events.EvaluationCompleted {
	return events.EvaluationCompleted{
		ExecutionID: exec, TeamID: team, TeamName: name, RoundNumber: round,
		Submission: events.Submission{Content: content, Format: "md"},
		Evaluation: events.Scores{OverallScore: score, Feedback: "feedback for " + team + " round " + fmt.Sprint(round),
			Metrics: []events.Metric{{MetricName: "ClarityCoherence", Score: score, EvaluatorComment: "comment " + team}}},
		EvaluatedAt: at,
	}
}

func (e *env) publishEvaluation(id string, ev events.EvaluationCompleted) uint64 {
	e.t.Helper()
	return e.publish(events.EvaluationSubject(ev.ExecutionID, ev.TeamID), id, events.TypeEvaluationCompleted, ev.EvaluatedAt, ev)
}

func (e *env) requestRound(id string, rr events.RoundRequested, at time.Time) {
	e.t.Helper()
	e.publish(events.RoundSubject(rr.ExecutionID, rr.TeamID), id, events.TypeRoundRequested, at, rr)
}

// received is one message read back from a stream.
type received struct {
	Subject string
	Header  nats.Header
	Body    []byte
	Seq     uint64
	Time    time.Time // when the stream stored it
}

// collect reads every message of stream matching filter until n arrived or the limit passed.
func (e *env) collect(stream, filter string, n int, limit time.Duration) []received {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var cons jetstream.Consumer
	// The stream is created by a service at start.
	testenv.WaitFor(e.t, limit, fmt.Sprintf("an ordered consumer of %s %s", stream, filter), func() (bool, string) {
		var err error
		cons, err = e.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		return err == nil, fmt.Sprint(err)
	})
	var out []received
	for len(out) < n {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			e.t.Fatal(err)
		}
		for msg := range batch.Messages() {
			md, _ := msg.Metadata()
			out = append(out, received{Subject: msg.Subject(), Header: msg.Headers(), Body: msg.Data(), Seq: md.Sequence.Stream, Time: md.Timestamp})
		}
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

// dataOf decodes the data of a CloudEvent body into v.
func dataOf(t testing.TB, body []byte, v any) events.Envelope {
	t.Helper()
	var env events.Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("envelope: %v: %s", err, body)
	}
	if err := json.Unmarshal(env.Data, v); err != nil {
		t.Fatalf("data: %v: %s", err, env.Data)
	}
	return env
}

// storeExec runs one statement on the test's ClickHouse database.
func (e *env) storeExec(query string) {
	e.t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{e.chAddr}, Auth: clickhouse.Auth{Database: e.database}})
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(context.Background(), query); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
}

// dropSnapshot removes the ranker's score snapshot of an execution (events.BucketScores), so that
// the next prompt of it reads ClickHouse.
func (e *env) dropSnapshot(executionID string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := e.js.KeyValue(ctx, events.BucketScores)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := kv.Delete(ctx, executionID); err != nil {
		e.t.Fatal(err)
	}
}
