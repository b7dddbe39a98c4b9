// Package streamscan reads what a stream holds on a subject filter, oldest first: the audit
// records of the CLI and the console, the console's catch-up of requests and answers, and the
// refills of the ranker and the archiver. One batch is in hand at a time, so what a reader keeps is
// its own choice, not the stream's size.
//
// It reads by batched direct gets ($JS.API.DIRECT.GET.<stream> with a batch), not by a consumer:
// a role that may read a stream need not be one that may make, pull from or delete consumers on
// it, so no reader can take or delete the durable an orchestrator waits on (docs/operating.md,
// the roles table). A direct get is answered by any replica, and a follower may lag its leader:
// where a batch ends before what the stream held when the scan began, the leader is asked
// (STREAM.MSG.GET), and its answer read, so a lagging replica never makes a scan short.
package streamscan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// batchMax is the most messages one direct get asks for, batchBytes the most bytes (raised to
// the server's max payload, so one message always fits; the server stops a batch once it has
// sent this many bytes).
const (
	batchMax   = 256
	batchBytes = 4 << 20
)

// answerWait bounds the wait for each message of a batch's answer: a server that stops answering
// part way fails the scan instead of hanging it.
const answerWait = 10 * time.Second

// Scan hands fn every message of stream on filter after sequence after (0: from the first),
// oldest first, up to what the stream held when the scan began; fn's error stops it. It returns
// how many messages fn saw. A missing stream is jetstream.ErrStreamNotFound, wrapped. A message
// handed to fn is read, not delivered: it cannot be acknowledged.
func Scan(ctx context.Context, js jetstream.JetStream, stream, filter string, after uint64, fn func(jetstream.Msg) error) (int, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", stream, err)
	}
	info := st.CachedInfo()
	r := reader{nc: js.Conn(), stream: stream, filter: filter, maxBytes: batchBytes}
	if r.filter == "" {
		r.filter = ">"
	}
	if r.nc == nil {
		return 0, fmt.Errorf("read %s: a JetStream context without a connection", stream)
	}
	// Batched direct gets came with nats-server 2.11: an older server answers one message and no
	// end of batch, so it is read from its leader instead.
	r.direct = info.Config.AllowDirect && batchesDirectGets(r.nc.ConnectedServerVersion())
	r.maxBytes = max(r.maxBytes, int(r.nc.MaxPayload())+64<<10)
	end := info.State.LastSeq
	read := 0
	for next := after + 1; next <= end; {
		got, err := r.batch(ctx, next, end, func(m *stored) error {
			if m.seq < next {
				return fmt.Errorf("read %s: a direct get answered sequence %d when asked from %d", stream, m.seq, next)
			}
			read++
			next = m.seq + 1
			return fn(m)
		})
		if err != nil {
			return read, err
		}
		if got > 0 {
			continue
		}
		// The replica that answered holds nothing more on filter: the end only if the leader
		// agrees. Otherwise that replica lags, and the leader's message is read in its place.
		m, err := r.leaderGet(ctx, next)
		if err != nil {
			return read, err
		}
		if m == nil || m.seq > end {
			break
		}
		if m.seq < next {
			return read, fmt.Errorf("read %s: the leader answered sequence %d when asked from %d", stream, m.seq, next)
		}
		read++
		next = m.seq + 1
		if err := fn(m); err != nil {
			return read, err
		}
	}
	return read, nil
}

// Follow hands fn every message of stream on filter after sequence after, as Scan does, then
// every later one as it is stored, asking again every poll, until ctx ends (its error is then
// nil: the normal end of following) or fn fails. A stream not yet made, or a read that fails, is
// waited for.
func Follow(ctx context.Context, js jetstream.JetStream, stream, filter string, after uint64, poll time.Duration, fn func(jetstream.Msg) error) error {
	for {
		var fnErr error
		_, _ = Scan(ctx, js, stream, filter, after, func(m jetstream.Msg) error {
			if md, err := m.Metadata(); err == nil {
				after = md.Sequence.Stream
			}
			fnErr = fn(m)
			return fnErr
		})
		if ctx.Err() != nil {
			return nil
		}
		// fn's error ends it; a read that failed (a reconnect, an election, a stream not made
		// yet) is asked again at the next poll.
		if fnErr != nil {
			return fnErr
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
	}
}

// Last is the last sequence stream holds (0 when empty): where a reader of only what comes next
// starts.
func Last(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", stream, err)
	}
	return st.CachedInfo().State.LastSeq, nil
}

// batchesDirectGets reports whether a server of version v (major.minor.patch) answers batched
// direct gets: 2.11 and later.
func batchesDirectGets(v string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return false // unknown: the leader's gets work on every version
	}
	return major > 2 || (major == 2 && minor >= 11)
}

// LeaderNext asks the stream's leader (STREAM.MSG.GET, never a replica that may lag) for the first
// message on subject at or after seq; nil when the stream holds none. A missing stream is
// jetstream.ErrStreamNotFound, wrapped.
func LeaderNext(ctx context.Context, nc *nats.Conn, stream, subject string, seq uint64) (jetstream.Msg, error) {
	m, err := reader{nc: nc, stream: stream, filter: subject}.leaderGet(ctx, seq)
	if m == nil || err != nil {
		return nil, err // a nil *stored is no message, not a jetstream.Msg holding nil
	}
	return m, nil
}

// reader asks one stream for its messages on one filter.
type reader struct {
	nc       *nats.Conn
	stream   string
	filter   string
	direct   bool // the stream allows direct gets; a stream made before it did is read from its leader
	maxBytes int
}

// batch asks for the messages on filter from sequence from on, and hands fn each one up to end.
// It returns how many it handed; 0 when the replica that answered holds none.
func (r reader) batch(ctx context.Context, from, end uint64, fn func(*stored) error) (int, error) {
	if !r.direct {
		return 0, nil // the caller asks the leader, one message at a time
	}
	req, err := json.Marshal(struct {
		Seq      uint64 `json:"seq"`
		NextFor  string `json:"next_by_subj"`
		Batch    int    `json:"batch"`
		MaxBytes int    `json:"max_bytes"`
	}{from, r.filter, int(min(end-from+1, batchMax)), r.maxBytes})
	if err != nil {
		return 0, err
	}
	sub, err := r.nc.SubscribeSync(r.nc.NewInbox())
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", r.stream, err)
	}
	defer sub.Unsubscribe()
	if err := r.nc.PublishRequest("$JS.API.DIRECT.GET."+r.stream, sub.Subject, req); err != nil {
		return 0, fmt.Errorf("read %s: %w", r.stream, err)
	}
	handed := 0
	for {
		wait, cancel := context.WithTimeout(ctx, answerWait)
		msg, err := sub.NextMsgWithContext(wait)
		cancel()
		if err != nil {
			return handed, fmt.Errorf("read %s: a direct get from sequence %d: %w", r.stream, from, err)
		}
		switch status := msg.Header.Get("Status"); status {
		case "":
		case "204": // end of the batch
			return handed, nil
		case "404": // nothing on filter at or after from, on this replica
			return handed, nil
		case "503":
			return handed, fmt.Errorf("read %s: a direct get: %w", r.stream, nats.ErrNoResponders)
		default:
			return handed, fmt.Errorf("read %s: a direct get from sequence %d answered %s %s", r.stream, from, status, msg.Header.Get("Description"))
		}
		m, err := fromDirect(r.stream, msg)
		if err != nil {
			return handed, err
		}
		if m.seq > end {
			return handed, nil // stored after the scan began
		}
		handed++
		if err := fn(m); err != nil {
			return handed, err
		}
	}
}

// leaderGet asks the stream's leader for the first message on filter at or after seq; nil when
// it holds none.
func (r reader) leaderGet(ctx context.Context, seq uint64) (*stored, error) {
	return r.leaderAsk(ctx, struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
	}{seq, r.filter})
}

// LastOn asks the stream's leader for the last message on subject; nil when it holds none. A
// missing stream is jetstream.ErrStreamNotFound, wrapped.
func LastOn(ctx context.Context, nc *nats.Conn, stream, subject string) (jetstream.Msg, error) {
	m, err := reader{nc: nc, stream: stream, filter: subject}.leaderAsk(ctx, struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	if m == nil || err != nil {
		return nil, err
	}
	return m, nil
}

// leaderAsk sends the stream's leader a STREAM.MSG.GET request; nil when it holds no such message.
func (r reader) leaderAsk(ctx context.Context, get any) (*stored, error) {
	req, err := json.Marshal(get)
	if err != nil {
		return nil, err
	}
	// Bounded: a leader that never answers (a stream offline, a full API queue) fails the read.
	wait, cancel := context.WithTimeout(ctx, answerWait)
	defer cancel()
	msg, err := r.nc.RequestWithContext(wait, "$JS.API.STREAM.MSG.GET."+r.stream, req)
	if err != nil {
		return nil, fmt.Errorf("read %s: the leader's get: %w", r.stream, err)
	}
	var resp struct {
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("read %s: the leader's get: %w", r.stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == 10037: // no message found
		return nil, nil
	case resp.Error != nil && resp.Error.ErrCode == 10059: // stream not found
		return nil, fmt.Errorf("read %s: %w", r.stream, jetstream.ErrStreamNotFound)
	case resp.Error != nil:
		return nil, fmt.Errorf("read %s: the leader's get: %s (%d)", r.stream, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("read %s: the leader's get: an answer without a message", r.stream)
	}
	m := resp.Message
	out := &stored{stream: r.stream, subject: m.Subject, seq: m.Seq, at: m.Time, data: m.Data}
	if len(m.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(m.Header)
		if err != nil {
			return nil, fmt.Errorf("read %s: sequence %d: %w", r.stream, m.Seq, err)
		}
		out.header = h
	}
	return out, nil
}

// fromDirect reads a direct get's answer: the message, and where it is stored in its headers.
func fromDirect(stream string, msg *nats.Msg) (*stored, error) {
	// The server's values come after any a publisher set under the same names: the last one is
	// the server's (a publisher's Nats-Sequence must not move a scan).
	last := func(key string) string {
		vs := msg.Header.Values(key)
		if len(vs) == 0 {
			return ""
		}
		return vs[len(vs)-1]
	}
	seq, err := strconv.ParseUint(last(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("read %s: a direct get's answer without a sequence: %w", stream, err)
	}
	at, err := time.Parse(time.RFC3339Nano, last(jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("read %s: sequence %d: a direct get's answer without a time: %w", stream, seq, err)
	}
	pending, _ := strconv.ParseUint(last("Nats-Num-Pending"), 10, 64)
	return &stored{stream: stream, subject: last(jetstream.SubjectHeader), seq: seq, at: at, pending: pending,
		header: msg.Header, data: msg.Data}, nil
}
