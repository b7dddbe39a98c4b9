package inputs

import (
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/pkg/events"
)

// commits wakes the requests waiting for the ranker when it says it committed
// (events.SubjectCommitted): a wait checks the ack floor again at once instead of at its next
// poll. The floor stays the truth: a notice that is lost, or arrives before the floor moved,
// costs latency only, never correctness.
type commits struct {
	mu sync.Mutex
	ch chan struct{} // closed at the next notice
}

func newCommits() *commits { return &commits{ch: make(chan struct{})} }

// next is closed by the first notice after the call.
func (c *commits) next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

func (c *commits) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.ch)
	c.ch = make(chan struct{})
}

// listen subscribes to the ranker's notices (one subscription per composer).
func (c *commits) listen(nc *nats.Conn) (*nats.Subscription, error) {
	return nc.Subscribe(events.SubjectCommitted, func(*nats.Msg) { c.fire() })
}
