package auditlog

import (
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestAKeeperResumesItsOwnLogPastAnother: AUDIT's last checkpoint is another log's (a replica
// signing with another key, or a key turned on and off again); the keeper resumes its own log from
// its own last checkpoint, older in AUDIT, instead of starting it again at size 0 (before: a new
// tree, whose checkpoints no longer extended the ones an auditor kept).
func TestAKeeperResumesItsOwnLogPastAnother(t *testing.T) {
	ctx := t.Context()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamAudit); err != nil {
		t.Fatal(err)
	}
	keeper := func(name string) *Keeper {
		path, _ := key(t, name)
		signer, verifier, err := LoadKey(path)
		if err != nil {
			t.Fatal(err)
		}
		return &Keeper{JS: js, Name: name, Signer: signer, Verifier: verifier}
	}
	created := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	mine, other := keeper("mine"), keeper("other")
	origin := Origin(mine.Name, created)
	tree := NewTree()
	for i, leaf := range leaves(7) {
		if err := tree.Append(leaf); err != nil {
			t.Fatal(err)
		}
		if i == 3 || i == 6 {
			if err := mine.publish(ctx, origin, tree); err != nil {
				t.Fatal(err)
			}
		}
	}
	others := NewTree()
	if err := others.Append(leaves(1)[0]); err != nil {
		t.Fatal(err)
	}
	if err := other.publish(ctx, Origin(other.Name, created), others); err != nil {
		t.Fatal(err)
	}
	resumed, size, err := mine.resume(ctx, origin)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := tree.Root()
	got, _ := resumed.Root()
	if size != 7 || got != want {
		t.Fatalf("resumed at size %d with root %x; want its own last checkpoint, size 7 with root %x", size, got, want)
	}
	// A log of which AUDIT holds no checkpoint starts empty.
	if _, size, err := keeper("new").resume(ctx, Origin("new", created)); err != nil || size != 0 {
		t.Fatalf("a new log resumed at size %d (%v), want 0", size, err)
	}
}
