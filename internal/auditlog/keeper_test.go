package auditlog

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

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

// TestFromArchiveTakesEachSequenceOnce: what PROMPTS trimmed is read from the archive a page at a
// time, each replica's rows handed (a quorum read), in any order: each sequence appended once, in
// order; a sequence held in different rows (a writer of the archive planted one) or in none stops
// the log, named (a review found the keeper stopped for good on a quorum read's second copy, and
// signing whichever copy claimed the earliest stored_at).
func TestFromArchiveTakesEachSequenceOnce(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	body := func(seq uint64) []byte { return []byte(fmt.Sprintf(`{"id":"p-%d"}`, seq)) }
	for _, c := range []struct {
		name          string
		before        uint64
		differ, lacks uint64
		want          string // "": every sequence appended
	}{
		{name: "two replicas' copies, pages", before: 2*archivePage + 501},
		{name: "a sequence in different rows", before: 40, differ: 17, want: "position 16 (PROMPTS sequence 17): PROMPTS' retention trimmed it and the archive holds different rows there"},
		{name: "a sequence in none", before: 40, lacks: 23, want: "position 22 (PROMPTS sequence 23) is missing from PROMPTS and from the archive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := &Keeper{Archived: func(_ context.Context, at time.Time, after, before uint64, yield func(uint64, string, []byte) error) error {
				if !at.Equal(created) {
					t.Fatalf("read the archive of the stream created %s", at)
				}
				for replica := range 2 {
					for i := after + 1; i < before; i++ {
						seq := i
						if replica == 1 {
							seq = before - 1 - (i - after - 1) // the other replica's rows, in another order
						}
						if seq == c.lacks {
							continue
						}
						b := body(seq)
						if seq == c.differ && replica == 1 {
							b = []byte(`{"id":"planted"}`)
						}
						if err := yield(seq, "prompt.composed.x.t", b); err != nil {
							return err
						}
					}
				}
				return nil
			}}
			var got []uint64
			err := k.fromArchive(context.Background(), created, 0, c.before, func(seq uint64, leaf tlog.Hash) error {
				if leaf != LeafHash(seq, "prompt.composed.x.t", body(seq)) {
					t.Fatalf("sequence %d appended with another leaf", seq)
				}
				got = append(got, seq)
				return nil
			})
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("%v, want %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if uint64(len(got)) != c.before-1 {
				t.Fatalf("%d sequences appended, want %d", len(got), c.before-1)
			}
			for i, seq := range got {
				if seq != uint64(i)+1 {
					t.Fatalf("appended %d at %d", seq, i)
				}
			}
		})
	}
}
