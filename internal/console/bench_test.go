package console

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cpuTime is the CPU this process has used, user and system: the console's (and the test's
// client), since the benchmarks run JetStream and ClickHouse as processes of their own.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkExecutionPage renders the page of an execution of 100 teams x 20 rounds (2,000
// requests, prompts of 4 KB and evaluations, all distinct) and reports the server CPU per page:
//   - warm: the grid's index is kept between pages (a viewer reloading, a live update): the page
//     reads the scores (one ClickHouse query), the leader's submission and what the streams
//     hold past the index;
//   - cold: a console that never saw the execution reads all 4,000 stream messages first.
//
// go test -run '^$' -bench ExecutionPage -benchtime 50x ./internal/console
func BenchmarkExecutionPage(b *testing.B) {
	nc, js := externalNATS(b)
	tr := seedOn(b, nc, js, 100, 20, 4000)
	path := "/executions/" + tr.exec
	// A page served again and again by one console: its index is built by the first.
	warm := func(page string) func(*testing.B) {
		return func(b *testing.B) {
			h := tr.console(b).Handler()
			mustPage(b, h, page)
			b.ReportAllocs()
			b.ResetTimer()
			start := cpuTime(b)
			for range b.N {
				mustPage(b, h, page)
			}
			b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N)/1e6, "cpu-ms/page")
		}
	}
	b.Run("warm", warm(path))
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		var cpu time.Duration
		for range b.N {
			b.StopTimer()
			c := tr.console(b)
			b.StartTimer()
			start := cpuTime(b)
			mustPage(b, c.Handler(), path)
			cpu += cpuTime(b) - start
			b.StopTimer()
			c.Close()
			b.StartTimer()
		}
		b.ReportMetric(float64(cpu)/float64(b.N)/1e6, "cpu-ms/page")
	})
	b.Run("round", warm(path+"/teams/team-042/rounds/20"))
	b.Run("index-memory", func(b *testing.B) {
		// What one execution's index holds once built. The broker runs in this process and
		// pools megabytes of its own, so the heap as a whole says nothing of the index: the
		// heap profile does, counting what is still in use of what the index allocated.
		old := runtime.MemProfileRate
		runtime.MemProfileRate = 1
		defer func() { runtime.MemProfileRate = old }()
		c := tr.console(b)
		for range b.N {
			c.grid = newGridIndex(tr.js, 4, nil)
			if _, err := c.grid.get(b.Context(), tr.exec); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(inUseBy("internal/console.(*execIndex)"))/1024, "KiB/execution")
		runtime.KeepAlive(c)
	})
}

// inUseBy sums the heap in use of allocations made under functions whose name contains fn.
func inUseBy(fn string) int64 {
	runtime.GC()
	runtime.GC() // the profile is as of the last completed cycle
	recs := make([]runtime.MemProfileRecord, 4096)
	n, ok := runtime.MemProfile(recs, false)
	for !ok {
		recs = make([]runtime.MemProfileRecord, n+1024)
		n, ok = runtime.MemProfile(recs, false)
	}
	var total int64
	for _, r := range recs[:n] {
		frames := runtime.CallersFrames(r.Stack())
		for {
			f, more := frames.Next()
			if strings.Contains(f.Function, fn) {
				total += r.InUseBytes()
				break
			}
			if !more {
				break
			}
		}
	}
	return total
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func mustPage(tb testing.TB, h http.Handler, path string) {
	code, body := get(tb, h, path)
	if code != http.StatusOK {
		tb.Fatalf("GET %s: %d\n%.300s", path, code, body)
	}
}

// BenchmarkLiveViewers opens N live pages of one execution over real HTTP and reports what they
// cost: NATS subscriptions (the same whatever N), heap per viewer, and the CPU of one update
// fanned out to all of them.
//
// go test -run '^$' -bench LiveViewers -benchtime 20x ./internal/console
func BenchmarkLiveViewers(b *testing.B) {
	nc, js := externalNATS(b)
	tr := seedOn(b, nc, js, 2, 1, 100)
	c := tr.console(b)
	srv := httptest.NewServer(c.Handler())
	b.Cleanup(srv.Close)
	const viewers = 100
	subs := tr.nc.NumSubscriptions()
	before := heapInUse()
	streams := make([]*bufio.Reader, viewers)
	for i := range streams {
		resp, err := http.Get(srv.URL + "/live?execution=" + tr.exec)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { resp.Body.Close() })
		streams[i] = bufio.NewReader(resp.Body)
	}
	for c.hub.viewerCount() < viewers {
		time.Sleep(time.Millisecond)
	}
	heap := heapInUse() - min(before, heapInUse())
	if got := tr.nc.NumSubscriptions(); got != subs {
		b.Fatalf("%d viewers took %d subscriptions, want the %d of none", viewers, got, subs)
	}
	b.ReportMetric(float64(subs), "nats-subscriptions")
	b.ReportMetric(float64(heap)/viewers/1024, "heap-KiB/viewer")
	b.ResetTimer()
	start := cpuTime(b)
	for range b.N {
		if err := tr.nc.Publish("leaderboard.updated."+tr.exec, []byte("{}")); err != nil {
			b.Fatal(err)
		}
		for _, s := range streams {
			if err := nextUpdate(s); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N)/1e6, "cpu-ms/update")
}

// nextUpdate reads a live stream up to its next update event.
func nextUpdate(r *bufio.Reader) error {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if strings.TrimSpace(line) == "event: update" {
			_, err := r.ReadString('\n') // its data line
			return err
		}
	}
}

// externalNATS runs a JetStream server as a process of its own (built from the nats-server
// module this one depends on), so the CPU this process uses is the console's alone.
func externalNATS(b *testing.B) (*nats.Conn, jetstream.JetStream) {
	b.Helper()
	dir := b.TempDir()
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		b.Fatalf("build nats-server: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "-js", "-sd", filepath.Join(dir, "js"), "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	for i := 0; ; i++ {
		nc, err := nats.Connect(url)
		if err == nil {
			b.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				b.Fatal(err)
			}
			return nc, js
		}
		if i == 200 {
			b.Fatalf("nats-server on %s: %v", url, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
