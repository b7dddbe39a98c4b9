package auditlog

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Sources are what a check reads: the signed checkpoints, the stream and the archive, each handed
// over one item at a time (a check keeps 32 bytes a record, and the tree: 64 more).
type Sources struct {
	// Checkpoints hands every message of AUDIT on Subject, in stream order.
	Checkpoints func(yield func(auditSeq uint64, signed []byte) error) error
	// Stream hands every message PROMPTS holds, in stream order; First is its first sequence
	// (what retention trimmed lies below it), Last its last, both read before the scan.
	Stream      func(yield func(seq uint64, subject string, body []byte) error) error
	First, Last uint64
	// LastNow, when set, reads PROMPTS' last sequence again: asked just before the archive is read,
	// so that on a live system a record stored after the stream's scan, and archived before the
	// archive's read, is not taken for a row PROMPTS never stored.
	LastNow func() (uint64, error)
	// Archive hands every row of the archive that names this PROMPTS, each copy, in any order.
	Archive func(yield func(seq uint64, subject string, body []byte, eventID string) error) error
	// AckFloor is the archiver's: every record at or below it is in the archive.
	AckFloor uint64
	// IsRecord says whether a message is one the archiver archives (a prompt record, not a
	// message it dead-letters).
	IsRecord func(subject string, body []byte) bool
}

// Finding is one thing a check found wrong, at a position of the log (-1: none in particular).
type Finding struct {
	Position int64  `json:"position"`
	What     string `json:"what"`
}

// Report is what a check found.
type Report struct {
	Origin          string      `json:"origin"`
	StreamRecords   int64       `json:"stream_records"`
	ArchiveRows     int64       `json:"archive_rows"`
	Checkpoints     int         `json:"checkpoints"`            // signed ones of this log
	Others          int         `json:"other_logs_checkpoints"` // of other logs: not checked here
	Signed          int64       `json:"signed_size"`            // the size of the latest of them
	Consistent      int         `json:"consistency_proofs"`     // checked between consecutive checkpoints
	SinceConsistent bool        `json:"since_consistent,omitempty"`
	Findings        []Finding   `json:"findings"`
	Latest          *Checkpoint `json:"-"`
	// Tree is the tree the check computed over every position it could (an export proves its
	// records' inclusion from it).
	Tree *Hashes `json:"-"`
	// Older are the reports of this key's logs of PROMPTS streams deleted since, oldest first: their
	// records are in the archive alone (podium audit check reads them; CheckOlder).
	Older []Report `json:"older_logs,omitempty"`
	// Unsigned counts the rows of an older log past its last checkpoint: never signed, so neither
	// proven nor named (CheckOlder).
	Unsigned int64 `json:"unsigned_rows,omitempty"`
}

// Whole reports whether the check found nothing wrong in this log.
func (r Report) Whole() bool { return len(r.Findings) == 0 }

// EveryLogWhole reports whether the check found nothing wrong in this log and the older ones.
func (r Report) EveryLogWhole() bool {
	for _, o := range r.Older {
		if !o.EveryLogWhole() {
			return false
		}
	}
	return r.Whole()
}

// CheckOlder checks the log of a PROMPTS stream deleted since, whose records the archive alone
// holds (archive hands them, each copy, in any order): as Check does with a stream whose
// retention trimmed every record. Every position up to the last the archive holds, or the log's
// largest signed checkpoint when that is less, must be held and give the signed roots; a
// checkpoint past what the archive holds names what was lost with the stream (the table lost, or
// rows deleted from it). Rows past the largest checkpoint were never signed: counted (Unsigned),
// neither proven nor named; a row forged at a sequence far past it costs nothing (the positions
// up to the last row would be made one by one).
func CheckOlder(v note.Verifier, origin string, checkpoints func(yield func(auditSeq uint64, signed []byte) error) error,
	archive func(yield func(seq uint64, subject string, body []byte, eventID string) error) error, isRecord func(subject string, body []byte) bool) (Report, error) {
	var signed uint64
	err := checkpoints(func(_ uint64, note []byte) error {
		if c, err := Open(note, v); err == nil && c.Origin == origin && c.Size > 0 {
			signed = max(signed, uint64(c.Size))
		}
		return nil
	})
	if err != nil {
		return Report{Origin: origin}, fmt.Errorf("read AUDIT: %w", err)
	}
	var last uint64
	var unsigned int64
	err = archive(func(seq uint64, _ string, _ []byte, _ string) error {
		if seq > signed {
			unsigned++
			return nil
		}
		last = max(last, seq)
		return nil
	})
	if err != nil {
		return Report{Origin: origin}, fmt.Errorf("read the archive: %w", err)
	}
	rep, err := Check(v, origin, nil, Sources{
		Checkpoints: checkpoints,
		Stream:      func(func(uint64, string, []byte) error) error { return nil },
		First:       last + 1, Last: last,
		Archive: func(yield func(uint64, string, []byte, string) error) error {
			return archive(func(seq uint64, subject string, body []byte, eventID string) error {
				if seq > signed {
					return nil
				}
				return yield(seq, subject, body, eventID)
			})
		},
		IsRecord: isRecord,
	})
	rep.Unsigned, rep.Others = unsigned, 0 // the other logs are the current check's to count
	return rep, err
}

func (r *Report) find(pos int64, format string, args ...any) {
	r.Findings = append(r.Findings, Finding{Position: pos, What: fmt.Sprintf(format, args...)})
}

// Check proves, with nothing but the public key, that every checkpoint of origin is signed, that
// the log only grew from one to the next (and from since, a checkpoint an auditor kept, when
// given), and that PROMPTS and the archive hold exactly the records the signed tree holds. Each
// record deleted, changed, inserted or reordered is named with its position; a change that only
// the roots show (made alike in the stream and the archive) is named by the positions between
// the last checkpoint that still holds and the first that does not.
func Check(v note.Verifier, origin string, since []byte, src Sources) (Report, error) {
	rep := Report{Origin: origin, Findings: []Finding{}}
	checkpoints, err := readCheckpoints(v, origin, src, &rep)
	if err != nil {
		return rep, err
	}

	// The stream's leaves, by position.
	leaves := make([]tlog.Hash, 0, src.Last)
	held := make([]bool, 0, src.Last)
	records := make([]bool, 0, src.Last)
	err = src.Stream(func(seq uint64, subject string, body []byte) error {
		if seq == 0 || seq <= uint64(len(leaves)) {
			return fmt.Errorf("PROMPTS handed sequence %d after %d: not in stream order", seq, len(leaves))
		}
		for uint64(len(leaves))+1 < seq { // a gap: filled from the archive below, or named
			leaves, held, records = append(leaves, tlog.Hash{}), append(held, false), append(records, false)
		}
		leaves, held = append(leaves, LeafHash(seq, subject, body)), append(held, true)
		records = append(records, src.IsRecord(subject, body))
		rep.StreamRecords++
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("read PROMPTS: %w", err)
	}
	// The scan reads what the stream held when it began, which may be past Last; what was stored
	// after it is checked by the next check.
	last := max(src.Last, uint64(len(leaves)))
	now := last
	if src.LastNow != nil {
		if now, err = src.LastNow(); err != nil {
			return rep, fmt.Errorf("read PROMPTS' last sequence: %w", err)
		}
		now = max(now, last)
	}

	// The archive: each row against the stream, and the archive's copies where the stream has none.
	fromArchive := map[int64][]copyOf{}
	type leafAt struct {
		pos  int64
		leaf tlog.Hash
	}
	copied := map[leafAt]bool{} // each different row at a position once, however many times it is written
	archived := map[int64]bool{}
	err = src.Archive(func(seq uint64, subject string, body []byte, eventID string) error {
		pos, leaf := Position(seq), LeafHash(seq, subject, body)
		if seq > last && seq <= now {
			return nil // stored after the stream's scan: the next check's
		}
		rep.ArchiveRows++
		archived[pos] = true
		switch {
		case seq == 0:
			rep.find(-1, "the archive holds a row at sequence 0 (event id %s): no stream stores one there", eventID)
		case seq > now:
			rep.find(pos, "the archive holds a row (event id %s) at sequence %d, which PROMPTS never stored (its last is %d): inserted", eventID, seq, now)
		case pos < int64(len(held)) && held[pos]:
			if leaf != leaves[pos] {
				rep.find(pos, "the archive's row (event id %s) differs from what PROMPTS holds at sequence %d", eventID, seq)
			}
		default:
			if !copied[leafAt{pos, leaf}] {
				copied[leafAt{pos, leaf}] = true
				fromArchive[pos] = append(fromArchive[pos], copyOf{leaf, eventID})
			}
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("read the archive: %w", err)
	}

	// Every position up to the stream's last, from the stream, else from the archive.
	for uint64(len(leaves)) < last {
		leaves, held, records = append(leaves, tlog.Hash{}), append(held, false), append(records, false)
	}
	whole := int64(len(leaves)) // the tree can be computed below the first position held nowhere
	var ambiguous []int64       // positions the archive alone holds, in two or more different rows
	for pos := range int64(len(leaves)) {
		seq := uint64(pos) + 1
		if held[pos] {
			if records[pos] && seq <= src.AckFloor && !archived[pos] {
				rep.find(pos, "PROMPTS holds a record at sequence %d that the archive lacks, below the archiver's ack floor (%d): deleted from the archive", seq, src.AckFloor)
			}
			continue
		}
		copies := fromArchive[pos]
		switch {
		case len(copies) == 0:
			rep.find(pos, "sequence %d is in neither PROMPTS nor the archive: deleted from both", seq)
			whole = min(whole, pos)
			continue
		case len(copies) > 1:
			ambiguous = append(ambiguous, pos)
		case seq < src.First:
			// Trimmed by PROMPTS' retention: the archive is its copy.
		default:
			rep.find(pos, "sequence %d was deleted from PROMPTS; the archive holds it", seq)
		}
		leaves[pos] = copies[0].leaf
	}
	// The tree over every position (each the archive alone holds in different rows taken first as
	// its first copy).
	h := &Hashes{}
	for _, leaf := range leaves[:whole] {
		if err := h.Add(leaf); err != nil {
			return rep, err
		}
	}
	// Where the archive alone holds a position in different rows, the signed roots say which
	// one is the record: the others are named.
	if err := resolve(ambiguous, fromArchive, h, checkpoints, &rep); err != nil {
		return rep, err
	}
	rep.Tree = h
	// Checked against each signed root.
	var good *Checkpoint // the last checkpoint whose root the records still give
	for i := range checkpoints {
		c := &checkpoints[i]
		if c.Size > h.Size() {
			if c.Size > int64(len(leaves)) {
				rep.find(c.Size-1, "a checkpoint signs %d records; PROMPTS and the archive hold %d: records at positions %d to %d were deleted", c.Size, len(leaves), len(leaves), c.Size-1)
			} else {
				rep.find(whole, "the checkpoint of size %d cannot be checked: position %d is held nowhere", c.Size, whole)
			}
			continue
		}
		root, err := h.Root(c.Size)
		if err != nil {
			return rep, err
		}
		if root != c.Root {
			from := int64(0)
			if good != nil {
				from = good.Size
			}
			rep.find(from, "the records at positions %d to %d are not what the checkpoint of size %d signed: one was changed, deleted, inserted or reordered in PROMPTS and the archive alike", from, c.Size-1, c.Size)
			continue
		}
		if good != nil && good.Size < c.Size {
			p, err := h.Consistency(good.Size, c.Size)
			if err != nil {
				return rep, err
			}
			if err := tlog.CheckTree(p, c.Size, c.Root, good.Size, good.Root); err != nil {
				rep.find(good.Size, "the checkpoint of size %d does not extend the one of size %d: %v", c.Size, good.Size, err)
				continue
			}
			rep.Consistent++
		}
		good = c
	}
	if len(checkpoints) > 0 {
		rep.Latest = &checkpoints[len(checkpoints)-1]
		rep.Signed = rep.Latest.Size
	} else if rep.StreamRecords > 0 {
		rep.find(-1, "AUDIT holds no checkpoint of this log (%s), signed by this key, though PROMPTS holds %d records: is the archiver keeping it (ARCHIVER_AUDIT_SIGNING_KEY_FILE), and is this its key?", origin, rep.StreamRecords)
	}
	if since != nil {
		if err := checkSince(v, origin, since, h, rep.Latest, &rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// copyOf is one of the archive's rows at a position the stream no longer holds.
type copyOf struct {
	leaf    tlog.Hash
	eventID string
}

// maxTries bounds the combinations of copies resolve tries under one checkpoint, and
// maxTriesInAll those of a whole check (a try costs about 10 µs: a forger writing copies under
// every checkpoint must not make a check take hours).
const (
	maxTries      = 1 << 12
	maxTriesInAll = 1 << 18
)

// resolve picks, at each position the archive alone holds in different rows (ambiguous, in
// order), the row the signed roots were made over, sets it in h, and names the others. The
// positions are taken by the first checkpoint that signs them: those under one checkpoint are
// resolved together (its root depends on each), trying the combinations of their copies (at most
// maxTries; past that, each is named as one that cannot be told), each try setting the leaves
// that changed in h (O(log n) each) and reading the root (O(log n)). Computing the tree again for
// each copy, as a first version did, was O(n) a try (BenchmarkCheckForgedCopies), and stood one
// position's first copy in for it while another was tried, so a forged copy written first at two
// positions under one checkpoint left both unresolved.
func resolve(ambiguous []int64, copies map[int64][]copyOf, h *Hashes, checkpoints []Checkpoint, rep *Report) error {
	budget := maxTriesInAll
	for len(ambiguous) > 0 {
		pos := ambiguous[0]
		i := slices.IndexFunc(checkpoints, func(c Checkpoint) bool { return c.Size > pos })
		if i < 0 || checkpoints[i].Size > h.Size() {
			for _, p := range ambiguous {
				rep.find(p, "the archive holds %d different rows at sequence %d, and no checkpoint that can be checked signs it: which is the record cannot be told", len(copies[p]), p+1)
			}
			return nil
		}
		c := checkpoints[i]
		n := 1
		for n < len(ambiguous) && ambiguous[n] < c.Size {
			n++
		}
		group := ambiguous[:n]
		ambiguous = ambiguous[n:]
		picked, tried, err := combination(group, copies, h, c, budget)
		if err != nil {
			return err
		}
		budget -= tried
		if picked == nil {
			for _, p := range group {
				rep.find(p, "none of the archive's %d rows at sequence %d, with those at the other %d positions the archive alone holds in several rows under it, gives the root the checkpoint of size %d signed (or more than can be tried)", len(copies[p]), p+1, len(group)-1, c.Size)
			}
			// Every later checkpoint's root depends on these positions too: what is left cannot
			// be told either, and is not tried.
			for _, p := range ambiguous {
				rep.find(p, "the archive holds %d different rows at sequence %d; which is the record cannot be told while the rows at sequence %d and after, held in several rows too, are not told", len(copies[p]), p+1, group[0]+1)
			}
			return nil
		}
		for k, p := range group {
			genuine := copies[p][picked[k]]
			if err := h.Set(p, genuine.leaf); err != nil {
				return err
			}
			for j, cp := range copies[p] {
				if j != picked[k] {
					rep.find(p, "the archive's row (event id %s) at sequence %d is not the record the log signed (event id %s is)", cp.eventID, p+1, genuine.eventID)
				}
			}
		}
	}
	return nil
}

// combination is the copy of each position of group (by its index in copies) that gives c's root,
// trying every combination (h's leaves at group are set as it tries: the caller sets the answer),
// and how many it tried; nil when none does, or there are more than maxTries or budget.
func combination(group []int64, copies map[int64][]copyOf, h *Hashes, c Checkpoint, budget int) ([]int, int, error) {
	tries := 1
	for _, p := range group {
		if tries *= len(copies[p]); tries > min(maxTries, budget) {
			return nil, 0, nil
		}
	}
	digits := make([]int, len(group)) // an odometer over the copies, the first position fastest
	for _, p := range group {
		if err := h.Set(p, copies[p][0].leaf); err != nil {
			return nil, 0, err
		}
	}
	for tried := 1; ; tried++ {
		root, err := h.Root(c.Size)
		if err != nil {
			return nil, tried, err
		}
		if root == c.Root {
			return digits, tried, nil
		}
		k := 0
		for ; k < len(group); k++ {
			p := group[k]
			digits[k] = (digits[k] + 1) % len(copies[p])
			if err := h.Set(p, copies[p][digits[k]].leaf); err != nil {
				return nil, tried, err
			}
			if digits[k] != 0 {
				break
			}
		}
		if k == len(group) {
			return nil, tried, nil // every combination tried
		}
	}
}

// readCheckpoints reads the signed checkpoints of origin in AUDIT's order, naming any not signed
// by the key and any that states a smaller log than one before it.
func readCheckpoints(v note.Verifier, origin string, src Sources, rep *Report) ([]Checkpoint, error) {
	var out []Checkpoint
	err := src.Checkpoints(func(auditSeq uint64, signed []byte) error {
		// Another log's (a PROMPTS deleted since, another key's before a rotation): its first
		// line, the origin, says so; only one that claims this log must be signed by its key.
		if first, _, _ := strings.Cut(string(signed), "\n"); first != origin {
			rep.Others++
			return nil
		}
		c, err := Open(signed, v)
		if err != nil {
			rep.find(-1, "AUDIT sequence %d: %v", auditSeq, err)
			return nil
		}
		// Replicas sign at their own sizes, so a smaller one may come after a larger: by size,
		// each checked against the tree and its neighbours (a log that went back shows there).
		for _, o := range out {
			if o.Size == c.Size {
				if o.Root != c.Root {
					rep.find(c.Size, "AUDIT sequence %d signs another root for the same %d records: the log forked", auditSeq, c.Size)
				}
				return nil
			}
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read AUDIT: %w", err)
	}
	slices.SortFunc(out, func(a, b Checkpoint) int { return cmp.Compare(a.Size, b.Size) })
	rep.Checkpoints = len(out)
	return out, nil
}

// checkSince proves the latest checkpoint extends since, a checkpoint the auditor kept.
func checkSince(v note.Verifier, origin string, since []byte, h *Hashes, latest *Checkpoint, rep *Report) error {
	s, err := Open(since, v)
	if errors.Is(err, ErrNotSigned) {
		return fmt.Errorf("the checkpoint given with --since: %w", err)
	}
	if err != nil {
		return fmt.Errorf("the checkpoint given with --since: %w", err)
	}
	switch {
	case s.Origin != origin:
		rep.find(-1, "the checkpoint given with --since is of another log (%s): PROMPTS was made again since", s.Origin)
		return nil
	case latest == nil || latest.Size < s.Size:
		rep.find(s.Size, "the checkpoint given with --since signs %d records; AUDIT's latest signs fewer: the log went back", s.Size)
		return nil
	case latest.Size == s.Size:
		if !bytes.Equal(latest.Root[:], s.Root[:]) {
			rep.find(s.Size, "the checkpoint given with --since and AUDIT's latest sign different roots for %d records: the log forked", s.Size)
		} else {
			rep.SinceConsistent = true
		}
		return nil
	}
	if latest.Size > h.Size() {
		rep.find(h.Size(), "the log cannot be proven to have only grown since the checkpoint given: position %d is held nowhere", h.Size())
		return nil
	}
	p, err := h.Consistency(s.Size, latest.Size)
	if err != nil {
		return err
	}
	if err := tlog.CheckTree(p, latest.Size, latest.Root, s.Size, s.Root); err != nil {
		rep.find(0, "the log did not only grow since the checkpoint given with --since (size %d): %v", s.Size, err)
		return nil
	}
	rep.SinceConsistent = true
	return nil
}
