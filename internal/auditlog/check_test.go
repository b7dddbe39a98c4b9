package auditlog

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// logFixture is a log of n messages, signed at the given sizes: what the stream, the archive and
// AUDIT hold, each changed by a test as tampering would.
type logFixture struct {
	origin   string
	stream   map[uint64][2]string // seq → subject, body
	archive  []archiveRow
	signed   [][]byte
	first    uint64
	last     uint64
	ackFloor uint64
	lastNow  uint64 // PROMPTS' last sequence when the archive is read (0: last)
}

type archiveRow struct {
	seq           uint64
	subject, body string
	id            string
}

func newFixture(t testing.TB, n int, at ...int64) (*logFixture, string) {
	t.Helper()
	path, public := key(t, "fixture")
	signer, _, err := LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &logFixture{origin: Origin("fixture", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), stream: map[uint64][2]string{}, first: 1, last: uint64(n), ackFloor: uint64(n)}
	tree := NewTree()
	for i := 1; i <= n; i++ {
		subject, body := fmt.Sprintf("prompt.composed.x.t%d", i%2), fmt.Sprintf(`{"id":"p-%d"}`, i)
		f.stream[uint64(i)] = [2]string{subject, body}
		f.archive = append(f.archive, archiveRow{uint64(i), subject, body, fmt.Sprintf("p-%d", i)})
		if err := tree.Append(LeafHash(uint64(i), subject, []byte(body))); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(at, int64(i)) {
			root, _ := tree.Root()
			c, err := Sign(f.origin, int64(i), root, signer)
			if err != nil {
				t.Fatal(err)
			}
			f.signed = append(f.signed, c.Signed)
		}
	}
	return f, public
}

func (f *logFixture) check(t testing.TB, public string, since []byte) Report {
	t.Helper()
	v, err := Verifier(public)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Check(v, f.origin, since, Sources{
		Checkpoints: f.checkpoints,
		Stream: func(yield func(uint64, string, []byte) error) error {
			for seq := f.first; seq <= f.last; seq++ {
				if m, ok := f.stream[seq]; ok {
					if err := yield(seq, m[0], []byte(m[1])); err != nil {
						return err
					}
				}
			}
			return nil
		},
		First: f.first, Last: f.last,
		Archive:  f.archived,
		AckFloor: f.ackFloor,
		IsRecord: func(string, []byte) bool { return true },
		LastNow:  func() (uint64, error) { return max(f.lastNow, f.last), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// checkpoints hands what AUDIT holds, in order.
func (f *logFixture) checkpoints(yield func(uint64, []byte) error) error {
	for i, s := range f.signed {
		if err := yield(uint64(i+1), s); err != nil {
			return err
		}
	}
	return nil
}

// archived hands every row of the archive.
func (f *logFixture) archived(yield func(uint64, string, []byte, string) error) error {
	for _, r := range f.archive {
		if err := yield(r.seq, r.subject, []byte(r.body), r.id); err != nil {
			return err
		}
	}
	return nil
}

func findings(rep Report) string {
	var b strings.Builder
	for _, f := range rep.Findings {
		fmt.Fprintf(&b, "%d: %s\n", f.Position, f.What)
	}
	return b.String()
}

// TestCheckNamesEachTampering: a log that only grew is whole; each kind of tampering is named
// with its position.
func TestCheckNamesEachTampering(t *testing.T) {
	for _, tt := range []struct {
		name   string
		tamper func(f *logFixture)
		want   []string // each a finding's text, with its position first
	}{
		{"whole", func(*logFixture) {}, nil},
		{"a row forged at a new sequence", func(f *logFixture) {
			f.archive = append(f.archive, archiveRow{40, "prompt.composed.x.t0", `{"id":"forged"}`, "forged"})
		}, []string{"39: the archive holds a row (event id forged) at sequence 40, which PROMPTS never stored"}},
		{"a row changed in the archive", func(f *logFixture) {
			f.archive[4].body = `{"id":"p-5","changed":true}`
		}, []string{"4: the archive's row (event id p-5) differs from what PROMPTS holds at sequence 5"}},
		{"a row deleted from the archive", func(f *logFixture) {
			f.archive = slices.Delete(f.archive, 9, 10)
		}, []string{"9: PROMPTS holds a record at sequence 10 that the archive lacks"}},
		{"a record gone from the stream, the archive holds it", func(f *logFixture) {
			delete(f.stream, 12)
		}, []string{"11: sequence 12 was deleted from PROMPTS; the archive holds it"}},
		{"trimmed by retention, and a forged copy of a trimmed record", func(f *logFixture) {
			f.first = 6
			f.archive = append(f.archive, archiveRow{3, "prompt.composed.x.t1", `{"id":"p-3","forged":true}`, "p-3"})
		}, []string{"2: the archive's row (event id p-3) at sequence 3 is not the record the log signed"}},
		{"gone from both", func(f *logFixture) {
			delete(f.stream, 12)
			f.archive = slices.Delete(f.archive, 11, 12)
		}, []string{"11: sequence 12 is in neither PROMPTS nor the archive", "11: the checkpoint of size 16 cannot be checked", "11: the checkpoint of size 20 cannot be checked"}},
		{"changed alike in the stream and the archive", func(f *logFixture) {
			f.stream[14] = [2]string{f.stream[14][0], `{"id":"p-14","changed":true}`}
			f.archive[13].body = `{"id":"p-14","changed":true}`
		}, []string{"10: the records at positions 10 to 15 are not what the checkpoint of size 16 signed", "10: the records at positions 10 to 19 are not what the checkpoint of size 20 signed"}},
		{"a checkpoint that is not signed", func(f *logFixture) {
			f.signed = append(f.signed, []byte(strings.Replace(string(f.signed[1]), "\n10\n", "\n11\n", 1)))
		}, []string{"-1: AUDIT sequence 5: the checkpoint is not signed by the log's key"}},
		{"a checkpoint of this log signed by another key", func(f *logFixture) {
			other, _ := newFixture(t, 20, 10)
			f.signed = append(f.signed, other.signed[0])
		}, []string{"-1: AUDIT sequence 5: the checkpoint is not signed by the log's key"}},
		{"another log's checkpoint (a key rotated, a stream made again): skipped", func(f *logFixture) {
			f.signed = append(f.signed, []byte("other/PROMPTS/2026-01-02T00:00:00Z\n3\nAAAA\n\n— other AAAA\n"))
		}, nil},
		{"checkpoints of two replicas, a smaller after a larger: whole", func(f *logFixture) {
			f.signed[1], f.signed[2] = f.signed[2], f.signed[1]
		}, nil},
		{"a row forged at a sequence past 2^63", func(f *logFixture) {
			f.archive = append(f.archive, archiveRow{1<<63 + 5, "prompt.composed.x.t0", "{}", "huge"})
		}, []string{"the archive holds a row (event id huge) at sequence 9223372036854775813, which PROMPTS never stored"}},
		{"no checkpoint at all", func(f *logFixture) {
			f.signed = nil
		}, []string{"-1: AUDIT holds no checkpoint of this log"}},
		{"a live system: records stored after the stream's scan, archived before the archive's read", func(f *logFixture) {
			f.archive = append(f.archive, archiveRow{21, "prompt.composed.x.t1", `{"id":"p-21"}`, "p-21"}, archiveRow{22, "prompt.composed.x.t0", `{"id":"p-22"}`, "p-22"})
			f.lastNow = 22
		}, nil},
		{"a live system, and a row forged past what PROMPTS holds now", func(f *logFixture) {
			f.archive = append(f.archive, archiveRow{21, "prompt.composed.x.t1", `{"id":"p-21"}`, "p-21"}, archiveRow{30, "prompt.composed.x.t0", `{}`, "forged"})
			f.lastNow = 21
		}, []string{"29: the archive holds a row (event id forged) at sequence 30, which PROMPTS never stored (its last is 21)"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, public := newFixture(t, 20, 4, 10, 16, 20)
			tt.tamper(f)
			rep := f.check(t, public, nil)
			got := findings(rep)
			if len(tt.want) == 0 && !rep.Whole() {
				t.Fatalf("findings in a whole log:\n%s", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in:\n%s", w, got)
				}
			}
			if len(rep.Findings) > len(tt.want)+1 {
				t.Errorf("more findings than the tampering explains:\n%s", got)
			}
		})
	}
}

// TestCheckSince: the log only grew since a checkpoint kept: passes; a kept checkpoint of a log
// that was changed below it: named.
func TestCheckSince(t *testing.T) {
	f, public := newFixture(t, 20, 4, 10, 16, 20)
	rep := f.check(t, public, f.signed[1])
	if !rep.Whole() || !rep.SinceConsistent || rep.Consistent != 3 {
		t.Fatalf("since size 10: whole %v, since %v, %d proofs:\n%s", rep.Whole(), rep.SinceConsistent, rep.Consistent, findings(rep))
	}
	// A checkpoint signed by another key is refused outright.
	g, public2 := newFixture(t, 20, 10, 20)
	v2, err := Verifier(public2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Check(v2, g.origin, f.signed[1], Sources{
		Checkpoints: func(func(uint64, []byte) error) error { return nil },
		Stream:      func(func(uint64, string, []byte) error) error { return nil },
		Archive:     func(func(uint64, string, []byte, string) error) error { return nil },
		IsRecord:    func(string, []byte) bool { return true },
	}); err == nil {
		t.Error("a --since checkpoint of another key was taken")
	}
}

// forgeCopies makes f's stream hold only its records from first on (its retention trimmed the
// others), and the archive hold a forged copy beside each of the records at positions: before it
// where before says so, else after.
func forgeCopies(f *logFixture, first uint64, positions []int64, before func(int64) bool) {
	f.first = first
	for _, pos := range positions {
		i := slices.IndexFunc(f.archive, func(r archiveRow) bool { return r.seq == uint64(pos)+1 })
		forged := archiveRow{f.archive[i].seq, f.archive[i].subject, fmt.Sprintf(`{"id":"forged-%d"}`, pos), fmt.Sprintf("forged-%d", pos)}
		if before(pos) {
			f.archive = slices.Insert(f.archive, i, forged)
		} else {
			f.archive = slices.Insert(f.archive, i+1, forged)
		}
	}
}

// TestCheckTellsTheRecordFromItsForgedCopies: where the stream no longer holds its records and the
// archive holds several rows at each of many positions (a forger's copy before or after the
// record), the signed roots say which row is the record: every forged one is named, no record.
func TestCheckTellsTheRecordFromItsForgedCopies(t *testing.T) {
	f, public := newFixture(t, 200, 37, 64, 100, 150, 200)
	var positions []int64
	for pos := int64(3); pos < 190; pos += 9 {
		positions = append(positions, pos)
	}
	forgeCopies(f, 195, positions, func(pos int64) bool { return pos%2 == 0 })
	rep := f.check(t, public, nil)
	got := findings(rep)
	for _, pos := range positions {
		want := fmt.Sprintf("%d: the archive's row (event id forged-%d) at sequence %d is not the record the log signed (event id p-%d is)", pos, pos, pos+1, pos+1)
		if !strings.Contains(got, want) {
			t.Errorf("missing %q", want)
		}
	}
	if len(rep.Findings) != len(positions) {
		t.Errorf("%d findings for %d forged rows:\n%s", len(rep.Findings), len(positions), got)
	}
	if rep.Consistent != 4 {
		t.Errorf("%d consistency proofs between the 5 checkpoints, want 4", rep.Consistent)
	}
}

// TestHashesSetIsTheTreeOfItsLeaves: a tree whose leaves were set after they were added has the
// roots, at every size, of the tree made of the final leaves.
func TestHashesSetIsTheTreeOfItsLeaves(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int64{1, 2, 3, 7, 8, 33, 100} {
		leaves := make([]tlog.Hash, n)
		set := &Hashes{}
		for i := range leaves {
			leaves[i] = sha256.Sum256([]byte(fmt.Sprint("leaf", i)))
			if err := set.Add(leaves[i]); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 * n {
			i := r.Int64N(n)
			leaves[i] = sha256.Sum256([]byte(fmt.Sprint("again", r.Uint64())))
			if err := set.Set(i, leaves[i]); err != nil {
				t.Fatal(err)
			}
		}
		fresh := &Hashes{}
		for _, l := range leaves {
			if err := fresh.Add(l); err != nil {
				t.Fatal(err)
			}
		}
		for size := int64(1); size <= n; size++ {
			a, _ := set.Root(size)
			b, _ := fresh.Root(size)
			if a != b {
				t.Fatalf("%d leaves: the root at size %d differs after Set", n, size)
			}
		}
	}
	if err := (&Hashes{}).Set(0, tlog.Hash{}); err == nil {
		t.Fatal("a leaf set in an empty tree")
	}
}

// BenchmarkCheckForgedCopies: a check of 20,000 records, signed every 100, whose stream kept the
// last 1,000, with a forged copy beside one record in each of the first 190 checkpoints' records:
// each copy tried by the root, its leaf set in the tree (before: the tree computed again for each).
//
// `go test -run '^$' -bench CheckForgedCopies ./internal/auditlog`
func BenchmarkCheckForgedCopies(b *testing.B) {
	var at []int64
	for size := int64(100); size <= 20000; size += 100 {
		at = append(at, size)
	}
	f, public := newFixture(b, 20000, at...)
	var positions []int64
	for pos := int64(50); pos < 19000; pos += 100 {
		positions = append(positions, pos)
	}
	forgeCopies(f, 19001, positions, func(pos int64) bool { return pos%200 == 50 })
	for b.Loop() {
		if rep := f.check(b, public, nil); len(rep.Findings) != len(positions) {
			b.Fatalf("%d findings for %d forged rows:\n%.500s", len(rep.Findings), len(positions), findings(rep))
		}
	}
}

// TestCheckOlderReadsTheArchiveAlone: the log of a PROMPTS deleted since is checked from the
// archive's rows alone: whole when they are the signed records (and rows past the last checkpoint,
// never signed, are counted, not named: a review made one row at sequence 2^62 crash the check, and
// one at 3,000,000 name 2,999,979 positions); a row deleted, the tail deleted (or the table lost
// with the stream), a row changed: each named with its position.
func TestCheckOlderReadsTheArchiveAlone(t *testing.T) {
	for _, tt := range []struct {
		name   string
		tamper func(f *logFixture)
		want   []string
	}{
		{"whole", func(*logFixture) {}, nil},
		{"a row deleted", func(f *logFixture) { f.archive = slices.Delete(f.archive, 6, 7) }, []string{"6: sequence 7 is in neither PROMPTS nor the archive"}},
		{"the signed tail deleted", func(f *logFixture) { f.archive = f.archive[:18] }, []string{"19: a checkpoint signs 20 records; PROMPTS and the archive hold 18: records at positions 18 to 19 were deleted"}},
		{"every row lost", func(f *logFixture) { f.archive = nil }, []string{"3: a checkpoint signs 4 records; PROMPTS and the archive hold 0: records at positions 0 to 3 were deleted"}},
		{"a row changed", func(f *logFixture) { f.archive[2].body = `{"id":"p-3","changed":true}` }, []string{"0: the records at positions 0 to 3 are not what the checkpoint of size 4 signed"}},
		{"rows forged far past the last checkpoint (unsigned: counted, not made one by one)", func(f *logFixture) {
			f.archive = append(f.archive, archiveRow{1 << 62, "prompt.composed.x.t0", "{}", "far"}, archiveRow{3000000, "prompt.composed.x.t0", "{}", "farther"})
		}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, public := newFixture(t, 22, 4, 10, 16, 20) // 21 and 22 never signed
			tt.tamper(f)
			v, err := Verifier(public)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := CheckOlder(v, f.origin, f.checkpoints, f.archived, func(string, []byte) bool { return true })
			if err != nil {
				t.Fatal(err)
			}
			got := findings(rep)
			if len(tt.want) == 0 && !rep.Whole() {
				t.Fatalf("findings in a whole log:\n%s", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in:\n%s", w, got)
				}
			}
			if int64(len(f.archive)) != rep.ArchiveRows+rep.Unsigned {
				t.Errorf("%d archive rows counted and %d unsigned, %d handed", rep.ArchiveRows, rep.Unsigned, len(f.archive))
			}
		})
	}
}

// TestCheckStopsTellingAfterAPositionItCannotTell: forged copies written first at 13 positions
// under one checkpoint (8,192 combinations, past what is tried): those are named as not told, and
// so is every later position held in several rows (each later root depends on the first ones),
// without trying them (a review found each later group named wrongly, after 4,096 tries each).
func TestCheckStopsTellingAfterAPositionItCannotTell(t *testing.T) {
	f, public := newFixture(t, 200, 100, 150, 200)
	var first []int64
	for pos := int64(2); pos < 80; pos += 6 {
		first = append(first, pos)
	}
	forgeCopies(f, 195, append(first, 120, 160), func(int64) bool { return true })
	rep := f.check(t, public, nil)
	got := findings(rep)
	for _, pos := range first {
		if want := fmt.Sprintf("%d: none of the archive's 2 rows at sequence %d, with those at the other 12 positions", pos, pos+1); !strings.Contains(got, want) {
			t.Errorf("missing %q", want)
		}
	}
	for _, pos := range []int64{120, 160} {
		if want := fmt.Sprintf("%d: the archive holds 2 different rows at sequence %d; which is the record cannot be told while the rows at sequence 3 and after", pos, pos+1); !strings.Contains(got, want) {
			t.Errorf("missing %q", want)
		}
	}
	if t.Failed() {
		t.Logf("findings:\n%s", got)
	}
}
