package auditlog

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
)

// EdgeHeader carries, beside each checkpoint, the right edge of the tree it states (base64,
// comma-separated): not signed, and refused by a keeper unless it gives the signed root.
const EdgeHeader = "Podium-Tree-Edge"

// Keeper extends the log as PROMPTS grows, in stream order: from the leaves the archiver offers as
// it is delivered each message (hashed from the bytes in hand), and, for any position not offered
// within a poll, from the stream itself (by direct gets: so every replica of the archiver keeps the
// same tree, whatever share of the durable's messages it archives). It publishes a signed checkpoint to AUDIT every Every records or every Interval,
// whichever comes first. Replicas publish the same checkpoint under the same message id (ed25519
// signatures are deterministic): AUDIT stores one.
type Keeper struct {
	JS       jetstream.JetStream
	Name     string // the log's name, the origin's first part: the key's name
	Signer   note.Signer
	Verifier note.Verifier // of Signer: a checkpoint resumed from must be the keeper's own
	Every    int64
	Interval time.Duration
	Poll     time.Duration // how often an idle keeper asks PROMPTS for more
	// Cond holds while the log grows with PROMPTS; it fails naming a record the log cannot take
	// (a position missing from the stream) or a stream that does not answer.
	Cond *health.Condition
	Log  *slog.Logger
	// Signed, when set, hears of each checkpoint published.
	Signed func(Checkpoint)
	// AckFloor is the archivers' durable's: a record at or below it was handled, and offered to
	// the keeper of the replica that handled it (nil: every record not offered within a poll is
	// read from the stream).
	AckFloor func(ctx context.Context) (uint64, error)
	// Archived, when set, hands the archive's rows of the PROMPTS created at created between two
	// sequences (excluded), every copy, in any order: what PROMPTS' retention trimmed before the
	// log reached it (a log begun on a stream that trimmed its first records, a keeper stopped for
	// longer than PROMPTS keeps them) is taken from there (fromArchive).
	Archived func(ctx context.Context, created time.Time, after, before uint64, yield func(seq uint64, subject string, body []byte) error) error

	offered offers // leaves the archiver was delivered (Offer), not yet in the tree
}

// errRemade ends one log: PROMPTS was made again, which starts a new one.
var errRemade = errors.New("PROMPTS was made again: a new log begins")

// Run keeps the log until ctx ends.
func (k *Keeper) Run(ctx context.Context) error {
	for failures := uint64(0); ; {
		err := k.keep(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errRemade) {
			k.Log.InfoContext(ctx, "PROMPTS was made again: the audit log starts a new tree")
			failures = 0
			continue
		}
		failures++
		k.Cond.Fail("the audit log does not grow: %v", err)
		k.Log.WarnContext(ctx, "the audit log does not grow; will retry", "error", err)
		if err := retry.Sleep(ctx, retry.Redelivery().Backoff(failures)); err != nil {
			return nil
		}
	}
}

// keep extends one log, PROMPTS as it is now, until the stream is made again or a fault.
func (k *Keeper) keep(ctx context.Context) error {
	created, err := k.created(ctx)
	if err != nil {
		return err
	}
	origin := Origin(k.Name, created)
	tree, signed, err := k.resume(ctx, origin)
	if err != nil {
		return err
	}
	lastSigned := time.Now()
	checkpoint := func() error {
		if tree.Size() == signed {
			return nil
		}
		// Only what this stream held: a stream made again since the records were read is
		// another log, and nothing read from it is signed as this one's.
		if now, err := k.created(ctx); err != nil {
			return err
		} else if !now.Equal(created) {
			return errRemade
		}
		if err := k.publish(ctx, origin, tree); err != nil {
			return err
		}
		signed, lastSigned = tree.Size(), time.Now()
		return nil
	}
	appendLeaf := func(seq uint64, leaf tlog.Hash) error {
		if got, want := Position(seq), tree.Size(); got != want {
			return fmt.Errorf("position %d (PROMPTS sequence %d) is missing from PROMPTS: the log cannot grow past it (`podium audit check` names what is gone)", want, want+1)
		}
		if err := tree.Append(leaf); err != nil {
			return err
		}
		if tree.Size()-signed >= k.Every {
			return checkpoint()
		}
		return nil
	}
	var behindSince time.Time // since when the tree has not grown while the stream held more
	for {
		before := tree.Size()
		// What the archiver was delivered, in order, first: hashed from the bytes it had.
		for {
			leaf, ok := k.offered.take(created, uint64(tree.Size())+1)
			if !ok {
				break
			}
			if err := appendLeaf(uint64(tree.Size())+1, leaf); err != nil {
				return err
			}
		}
		st, err := k.JS.Stream(ctx, events.StreamPrompts)
		if err != nil {
			return fmt.Errorf("look up %s: %w", events.StreamPrompts, err)
		}
		// Made again: the next read would take the new stream from the old size.
		if !st.CachedInfo().Created.UTC().Equal(created) {
			return errRemade
		}
		if first := st.CachedInfo().State.FirstSeq; uint64(tree.Size())+1 < first && k.Archived != nil {
			from := tree.Size()
			if err := k.fromArchive(ctx, created, uint64(tree.Size()), first, appendLeaf); err != nil {
				return err
			}
			k.Log.InfoContext(ctx, "the audit log took what PROMPTS' retention trimmed before the log reached it from the archive", "from_position", from, "to_position", tree.Size()-1)
		}
		switch last := st.CachedInfo().State.LastSeq; {
		case uint64(tree.Size()) >= last:
			behindSince = time.Time{}
		case behindSince.IsZero() || tree.Size() > before:
			behindSince = time.Now() // growing from offers: the archiver is about to offer the rest
		case time.Since(behindSince) >= k.Poll && k.handledElsewhere(ctx, uint64(tree.Size())+1, time.Since(behindSince)):
			// Handled and not offered here (another replica's share, an offer dropped), or the
			// archiver stuck: read from the stream.
			_, err := streamscan.Scan(ctx, k.JS, events.StreamPrompts, ">", uint64(tree.Size()), func(msg jetstream.Msg) error {
				md, err := msg.Metadata()
				if err != nil {
					return err
				}
				// The message in hand, not an offer: read from this stream, it is this log's.
				seq := md.Sequence.Stream
				return appendLeaf(seq, LeafHash(seq, msg.Subject(), msg.Data()))
			})
			if err != nil {
				return err
			}
			behindSince = time.Time{}
		}
		k.offered.forget(created, uint64(tree.Size()))
		if time.Since(lastSigned) >= k.Interval {
			if err := checkpoint(); err != nil {
				return err
			}
		}
		if behindSince.IsZero() || tree.Size() > before {
			k.Cond.Holds() // caught up, or growing
		}
		if err := retry.Sleep(ctx, k.Poll); err != nil {
			return err
		}
	}
}

// archivePage is how many sequences fromArchive reads in one query: 40 bytes each in memory.
const archivePage = 10000

// fromArchive appends the leaves of the sequences after after and before before, which PROMPTS no
// longer holds, from the archive's rows, a page at a time. A sequence the archive holds in
// different rows stops the log, named: the keeper cannot tell which one the stream held, and the
// row a writer of the archive planted must not be signed as the record (audit check names the
// copies). One it does not hold stops it too.
func (k *Keeper) fromArchive(ctx context.Context, created time.Time, after, before uint64, appendLeaf func(uint64, tlog.Hash) error) error {
	for page := after; page+1 < before; {
		end := min(before, page+archivePage+1)
		leaves := make(map[uint64]tlog.Hash, end-page-1)
		differ := map[uint64]bool{}
		err := k.Archived(ctx, created, page, end, func(seq uint64, subject string, body []byte) error {
			leaf := LeafHash(seq, subject, body)
			if have, ok := leaves[seq]; ok && have != leaf {
				differ[seq] = true
			}
			leaves[seq] = leaf
			return nil
		})
		if err != nil {
			return fmt.Errorf("positions PROMPTS' retention trimmed, from the archive: %w", err)
		}
		for seq := page + 1; seq < end; seq++ {
			leaf, ok := leaves[seq]
			switch {
			case differ[seq]:
				return fmt.Errorf("position %d (PROMPTS sequence %d): PROMPTS' retention trimmed it and the archive holds different rows there: the log cannot tell which to sign (`podium audit check` names them)", Position(seq), seq)
			case !ok:
				return fmt.Errorf("position %d (PROMPTS sequence %d) is missing from PROMPTS and from the archive: the log cannot grow past it (`podium audit check` names what is gone)", Position(seq), seq)
			}
			if err := appendLeaf(seq, leaf); err != nil {
				return err
			}
		}
		page = end - 1
	}
	return nil
}

// handledElsewhere reports whether the keeper should read the record at seq from the stream: the
// archivers' durable acknowledged it (whoever handled it offered it to its own keeper, not this
// one), or the keeper has waited for it longer than a checkpoint's interval (the archiver stuck:
// the log does not wait on ClickHouse).
func (k *Keeper) handledElsewhere(ctx context.Context, seq uint64, waited time.Duration) bool {
	if waited >= k.Interval || k.AckFloor == nil {
		return true
	}
	floor, err := k.AckFloor(ctx)
	return err != nil || floor >= seq
}

// Offer hands the keeper a message the archiver was delivered from the PROMPTS created at
// created: its leaf, hashed from the bytes in hand, spares the keeper reading the message again
// from the stream. What is offered and never taken (more than the keeper holds, a stream made again
// since) is read from the stream instead; an offer of another stream than the keeper's is never
// taken for it.
func (k *Keeper) Offer(created time.Time, seq uint64, subject string, body []byte) {
	k.offered.put(created.UTC(), seq, LeafHash(seq, subject, body))
}

// maxOffered bounds the leaves offered ahead of the tree that a keeper holds (32 bytes each).
const maxOffered = 1 << 16

// offers are the leaves offered and not yet taken, by sequence, of one stream: an offer of a newer
// stream drops those of the one before; one of an older stream is dropped.
type offers struct {
	mu      sync.Mutex
	created time.Time
	leaves  map[uint64]tlog.Hash
}

func (o *offers) put(created time.Time, seq uint64, leaf tlog.Hash) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case created.Before(o.created):
		return // a message of a stream deleted since
	case !created.Equal(o.created) || o.leaves == nil:
		o.created, o.leaves = created, map[uint64]tlog.Hash{}
	}
	if len(o.leaves) < maxOffered {
		o.leaves[seq] = leaf
	}
}

func (o *offers) take(created time.Time, seq uint64) (tlog.Hash, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !created.Equal(o.created) {
		return tlog.Hash{}, false
	}
	leaf, ok := o.leaves[seq]
	delete(o.leaves, seq)
	return leaf, ok
}

// forget drops what was offered at or below seq: a redelivery of what the tree holds.
func (o *offers) forget(created time.Time, seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !created.Equal(o.created) {
		return
	}
	for s := range o.leaves {
		if s <= seq {
			delete(o.leaves, s)
		}
	}
}

// created is PROMPTS' identity now: its creation time.
func (k *Keeper) created(ctx context.Context) (time.Time, error) {
	st, err := k.JS.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return time.Time{}, fmt.Errorf("look up %s: %w", events.StreamPrompts, err)
	}
	return st.CachedInfo().Created.UTC(), nil
}

// resume is the tree of the last checkpoint of origin, and its size; an empty tree when AUDIT
// holds none of it. A last checkpoint the keeper's key does not verify, or whose edge does not
// give its root, stops the keeper: it would sign on from a forgery.
func (k *Keeper) resume(ctx context.Context, origin string) (*Tree, int64, error) {
	st, err := k.JS.Stream(ctx, events.StreamAudit)
	if err != nil {
		return nil, 0, fmt.Errorf("look up %s: %w", events.StreamAudit, err)
	}
	last, err := st.GetLastMsgForSubject(ctx, Subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return NewTree(), 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read the last checkpoint: %w", err)
	}
	// The last checkpoint of another log (a PROMPTS deleted since, another key's, a replica signing
	// with another key): this log's own last checkpoint is searched for, older in AUDIT; none, and
	// this log starts empty.
	if first, _, _ := strings.Cut(string(last.Data), "\n"); first != origin {
		if last, err = k.lastOf(ctx, origin); err != nil || last == nil {
			return NewTree(), 0, err
		}
	}
	c, err := Open(last.Data, k.Verifier)
	if err != nil {
		return nil, 0, fmt.Errorf("the last checkpoint in %s (sequence %d): %w", events.StreamAudit, last.Sequence, err)
	}
	edge, err := parseEdge(last.Header.Get(EdgeHeader))
	if err != nil {
		return nil, 0, fmt.Errorf("the last checkpoint in %s (sequence %d): %w", events.StreamAudit, last.Sequence, err)
	}
	tree, err := ResumeTree(c, edge)
	if err != nil {
		return nil, 0, fmt.Errorf("the last checkpoint in %s (sequence %d): %w", events.StreamAudit, last.Sequence, err)
	}
	return tree, c.Size, nil
}

// lastOf is the last checkpoint of origin in AUDIT, read back from the start; nil when there is
// none.
func (k *Keeper) lastOf(ctx context.Context, origin string) (*jetstream.RawStreamMsg, error) {
	var last *jetstream.RawStreamMsg
	_, err := streamscan.Scan(ctx, k.JS, events.StreamAudit, Subject, 0, func(m jetstream.Msg) error {
		if first, _, _ := strings.Cut(string(m.Data()), "\n"); first != origin {
			return nil
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		last = &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: md.Sequence.Stream, Header: m.Headers(), Data: m.Data()}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("search %s for the last checkpoint of %s: %w", events.StreamAudit, origin, err)
	}
	return last, nil
}

// publish signs the tree as it is and publishes the checkpoint, with its edge.
func (k *Keeper) publish(ctx context.Context, origin string, tree *Tree) error {
	root, err := tree.Root()
	if err != nil {
		return err
	}
	c, err := Sign(origin, tree.Size(), root, k.Signer)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(Subject)
	msg.Data = c.Signed
	msg.Header.Set(EdgeHeader, formatEdge(tree.Edge()))
	if _, err := k.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("checkpoint %s %d", origin, c.Size))); err != nil {
		return fmt.Errorf("publish the checkpoint at size %d: %w", c.Size, err)
	}
	if k.Signed != nil {
		k.Signed(c)
	}
	return nil
}

func formatEdge(edge []tlog.Hash) string {
	parts := make([]string, len(edge))
	for i, h := range edge {
		parts[i] = base64.StdEncoding.EncodeToString(h[:])
	}
	return strings.Join(parts, ",")
}

func parseEdge(s string) ([]tlog.Hash, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]tlog.Hash, len(parts))
	for i, p := range parts {
		b, err := base64.StdEncoding.DecodeString(p)
		if err != nil || len(b) != tlog.HashSize {
			return nil, fmt.Errorf("the tree's edge kept beside it is not a list of hashes")
		}
		copy(out[i][:], b)
	}
	return out, nil
}
