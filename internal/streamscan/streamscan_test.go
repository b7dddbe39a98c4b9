package streamscan

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestScanIsBoundedAndLeavesNoConsumer: a scan over messages of nearly the server's max payload
// each (more than one fetch's byte bound together) reads every one of them in order, and leaves
// no consumer behind on the stream: a console page scanned per view must not pile them up.
func TestScanIsBoundedAndLeavesNoConsumer(t *testing.T) {
	ctx := context.Background()
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("p", int(nc.MaxPayload())-4096)
	const n = 12 // 12 MiB: three fetches' byte bound
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("prompt.composed.x.t%d", i%3), []byte(fmt.Sprintf("%02d%s", i, big))); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	read, err := Scan(ctx, js, events.StreamPrompts, "prompt.composed.x.*", 0, func(msg jetstream.Msg) error {
		got = append(got, string(msg.Data()[:2]))
		return nil
	})
	if err != nil || read != n {
		t.Fatalf("read %d of %d: %v", read, n, err)
	}
	for i, g := range got {
		if g != fmt.Sprintf("%02d", i) {
			t.Fatalf("message %d is %s: out of order", i, g)
		}
	}
	st, err := js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Errorf("%d consumers left on the stream after the scan", info.State.Consumers)
	}
}

// collect scans stream on filter after after and returns the sequences read.
func collect(t *testing.T, js jetstream.JetStream, stream, filter string, after uint64) []uint64 {
	t.Helper()
	var seqs []uint64
	read, err := Scan(context.Background(), js, stream, filter, after, func(msg jetstream.Msg) error {
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		seqs = append(seqs, md.Sequence.Stream)
		if err := msg.Ack(); err == nil {
			t.Errorf("a scanned message (sequence %d) was acknowledged", md.Sequence.Stream)
		}
		return nil
	})
	if err != nil || read != len(seqs) {
		t.Fatalf("scan %s %s after %d: read %d, handed %d: %v", stream, filter, after, read, len(seqs), err)
	}
	return seqs
}

// TestScanFiltersAndStartsAfter: a scan reads exactly the messages on its filter after the
// sequence it is given, across batches, whether the stream allows direct gets (batches from any
// replica) or was made before it did (the leader's gets, one at a time).
func TestScanFiltersAndStartsAfter(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	for _, direct := range []bool{true, false} {
		name := fmt.Sprintf("SCAN_DIRECT_%v", direct)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowDirect: direct}); err != nil {
			t.Fatal(err)
		}
		const n = 700 // more than two batches on each of the two subjects
		for i := range n {
			if _, err := js.Publish(ctx, fmt.Sprintf("%s.t%d", name, i%2), []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		for _, tt := range []struct {
			filter string
			after  uint64
			want   []uint64
		}{
			{name + ".>", 0, span(1, n, 1)},
			{name + ".t1", 0, span(2, n, 2)},
			{name + ".t0", 301, span(303, n, 2)},
			{name + ".t0", n, nil},
			{name + ".none", 0, nil},
		} {
			if got := collect(t, js, name, tt.filter, tt.after); !slices.Equal(got, tt.want) {
				t.Errorf("direct=%v: scan %s after %d: %d messages %v..., want %d", direct, tt.filter, tt.after, len(got), head(got), len(tt.want))
			}
		}
	}
	if _, err := Scan(ctx, js, "NO_SUCH_STREAM", ">", 0, func(jetstream.Msg) error { return nil }); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a missing stream: %v", err)
	}
}

// TestScanRightAfterEachPublishOnAnR3Stream: on a stream of three replicas, a scan from a client
// of any server, right after a publish is acknowledged (by the leader and one follower: the
// third may not hold it yet, and may answer the direct get), reads every message up to it.
func TestScanRightAfterEachPublishOnAnR3Stream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three NATS servers")
	}
	ctx := context.Background()
	cluster, err := servers.StartNATSCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range cluster {
			s.Shutdown()
		}
	})
	var clients []jetstream.JetStream
	for _, s := range cluster {
		_, js := testenv.JetStream(t, s)
		clients = append(clients, js)
	}
	cfg := jetstream.StreamConfig{Name: "SCAN_R3", Subjects: []string{"scan.>"}, Replicas: 3, AllowDirect: true}
	testenv.WaitFor(t, 20*time.Second, "an R3 stream", func() (bool, string) {
		_, err := clients[0].CreateStream(ctx, cfg)
		return err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse), fmt.Sprint(err)
	})
	const n = 150
	for i := range n {
		c := clients[i%len(clients)]
		var ack *jetstream.PubAck
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("publish %d acknowledged", i), func() (bool, string) {
			var err error
			ack, err = c.Publish(ctx, fmt.Sprintf("scan.t%d", i%2), []byte{byte(i)}, jetstream.WithMsgID(fmt.Sprint(i)))
			return err == nil, fmt.Sprint(err)
		})
		reader := clients[(i+1)%len(clients)]
		got := collect(t, reader, "SCAN_R3", "scan.>", 0)
		if len(got) < int(ack.Sequence) || got[ack.Sequence-1] != ack.Sequence {
			t.Fatalf("publish %d (sequence %d): a scan from another server right after the ack read %d messages", i, ack.Sequence, len(got))
		}
	}
}

// TestFollowReadsWhatComesLater: Follow hands what the stream held, then each message stored
// later, once each, until its context ends.
func TestFollowReadsWhatComesLater(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	publish := func(i int) {
		if _, err := js.Publish(ctx, fmt.Sprintf("prompt.composed.x.t%d", i%2), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		publish(i)
	}
	got := make(chan byte, 16)
	done := make(chan error, 1)
	follow, stop := context.WithCancel(ctx)
	go func() {
		done <- Follow(follow, js, events.StreamPrompts, "prompt.composed.x.t0", 0, 20*time.Millisecond, func(m jetstream.Msg) error {
			got <- m.Data()[0]
			return nil
		})
	}()
	for i := 3; i < 9; i++ {
		publish(i)
	}
	for _, want := range []byte{0, 2, 4, 6, 8} {
		select {
		case b := <-got:
			if b != want {
				t.Fatalf("followed %d, want %d", b, want)
			}
		case <-ctx.Done():
			t.Fatalf("waiting for %d: %v", want, ctx.Err())
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Follow ended with %v, want nil when its context ends", err)
	}
	select {
	case b := <-got:
		t.Fatalf("followed %d twice or off the filter", b)
	default:
	}
}

func span(from, to, step uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s += step {
		out = append(out, s)
	}
	return out
}

func head(s []uint64) []uint64 { return s[:min(len(s), 5)] }

// TestAPublishersHeadersDoNotMoveAScan: a message published with its own Nats-Sequence,
// Nats-Subject and Nats-Time-Stamp headers (which the server keeps, its own after them) is read
// at its real sequence and subject, once: a publisher cannot send a scan back or make it loop.
func TestAPublishersHeadersDoNotMoveAScan(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FORGED", Subjects: []string{"forged.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		msg := nats.NewMsg(fmt.Sprintf("forged.t%d", i))
		msg.Data = []byte{byte(i)}
		msg.Header.Set("Nats-Sequence", "1")
		msg.Header.Set("Nats-Subject", "forged.elsewhere")
		msg.Header.Set("Nats-Time-Stamp", "not a time")
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	var seqs []uint64
	var subjects []string
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	n, err := Scan(ctx, js, "FORGED", ">", 0, func(m jetstream.Msg) error {
		md, _ := m.Metadata()
		seqs, subjects = append(seqs, md.Sequence.Stream), append(subjects, m.Subject())
		return nil
	})
	if err != nil || n != 3 || !slices.Equal(seqs, []uint64{1, 2, 3}) || !slices.Equal(subjects, []string{"forged.t0", "forged.t1", "forged.t2"}) {
		t.Fatalf("read %d: %v %v, %v", n, seqs, subjects, err)
	}
}

// TestOnlyServersThatBatchAreAskedInBatches: nats-server 2.11 brought batched direct gets.
func TestOnlyServersThatBatchAreAskedInBatches(t *testing.T) {
	for v, want := range map[string]bool{"2.10.22": false, "2.11.0": true, "2.15.2": true, "3.0.0": true, "": false, "dev": false} {
		if got := batchesDirectGets(v); got != want {
			t.Errorf("%q: %v, want %v", v, got, want)
		}
	}
}
