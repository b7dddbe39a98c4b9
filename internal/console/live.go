package console

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/pkg/events"
)

// liveSubjects are what makes a page of an execution change: a new board (the ranker committed
// evaluations), a request, an answer. The hub subscribes to each once per console process,
// whatever the number of viewers.
var liveSubjects = []string{
	events.TypeLeaderboardUpdated + ".*",
	events.TypeRoundRequested + ".*.*",
	"prompt.*.*.*",
}

// hub fans the NATS messages of liveSubjects out to the pages that show their execution, as
// Server-Sent Events. A viewer holds one channel of one slot: notifications coalesce while a
// page is reloading its part, so a slow viewer costs one slot, never a queue.
type hub struct {
	max int // viewers at once; more are answered 503

	mu      sync.Mutex
	subs    []*nats.Subscription
	viewers map[*viewer]struct{}
	closed  bool

	onCount func(int) // reports the number of viewers (a gauge)
	onSent  func()    // counts notifications handed to viewers
}

type viewer struct {
	execution string // "" for every execution
	ch        chan struct{}
}

func newHub(maxViewers int, onCount func(int), onSent func()) *hub {
	return &hub{max: maxViewers, viewers: map[*viewer]struct{}{}, onCount: onCount, onSent: onSent}
}

// start subscribes; messages are read for their subject only. Pending limits bound what the
// client buffers if the hub falls behind: a dropped message is a notification missed by a
// page that another one will refresh.
func (h *hub) start(nc *nats.Conn) error {
	for _, subject := range liveSubjects {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) { h.notify(executionOf(m.Subject)) })
		if err != nil {
			h.stop()
			return fmt.Errorf("console: subscribe %s: %w", subject, err)
		}
		_ = sub.SetPendingLimits(4096, 64<<20)
		h.mu.Lock()
		h.subs = append(h.subs, sub)
		h.mu.Unlock()
	}
	return nil
}

// stop unsubscribes and ends every live response, so a shutdown does not wait for viewers.
func (h *hub) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.subs {
		_ = s.Unsubscribe()
	}
	h.subs = nil
	h.closed = true
	for v := range h.viewers {
		close(v.ch)
		delete(h.viewers, v)
	}
}

// executionOf is the execution token of a live subject (the third token of each).
func executionOf(subject string) string {
	parts := strings.SplitN(subject, ".", 4)
	if len(parts) < 3 {
		return ""
	}
	return parts[2]
}

func (h *hub) notify(execution string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for v := range h.viewers {
		if v.execution != "" && v.execution != execution {
			continue
		}
		select {
		case v.ch <- struct{}{}:
			if h.onSent != nil {
				h.onSent()
			}
		default: // one is pending already: the page will read everything new anyway
		}
	}
}

var errTooManyViewers = errors.New("too many live viewers")

func (h *hub) join(execution string) (*viewer, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("the console is stopping")
	}
	if len(h.viewers) >= h.max {
		return nil, errTooManyViewers
	}
	v := &viewer{execution: execution, ch: make(chan struct{}, 1)}
	h.viewers[v] = struct{}{}
	if h.onCount != nil {
		h.onCount(len(h.viewers))
	}
	return v, nil
}

func (h *hub) leave(v *viewer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.viewers, v)
	if h.onCount != nil {
		h.onCount(len(h.viewers))
	}
}

// viewerCount is the number of open live pages.
func (h *hub) viewerCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.viewers)
}

// keepAlive is how often an idle live response writes a comment, so proxies keep it open.
const keepAlive = 20 * time.Second

// serve is GET /live?execution=ID: an event stream that says "update" whenever something of
// that execution (or of any, without the parameter) changed. The page then fetches itself again.
func (h *hub) serve(w http.ResponseWriter, r *http.Request) {
	exec := r.URL.Query().Get("execution")
	if exec != "" && !events.ValidIdentifier(exec) {
		http.Error(w, "400 execution must be an identifier", http.StatusBadRequest)
		return
	}
	v, err := h.join(exec)
	if err != nil {
		http.Error(w, "503 "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer h.leave(v)
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // a live response outlives the server's write timeout
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprint(w, "retry: 2000\n\n")
	if err := rc.Flush(); err != nil {
		return
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case _, ok := <-v.ch:
			if !ok {
				return
			}
			fmt.Fprintf(w, "event: update\ndata: %s\n\n", exec)
		case <-tick.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}
