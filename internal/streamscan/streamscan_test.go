package streamscan

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

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
