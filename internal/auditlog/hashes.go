package auditlog

import (
	"fmt"

	"golang.org/x/mod/sumdb/tlog"
)

// Hashes is the whole tree an auditor computes from the leaves it read (two hashes per leaf in
// memory: 64 bytes a record), to compute roots at any size and to prove inclusion and
// consistency. It is a tlog.HashReader.
type Hashes struct {
	stored []tlog.Hash
	n      int64
}

// Add appends the next leaf.
func (h *Hashes) Add(leaf tlog.Hash) error {
	more, err := tlog.StoredHashesForRecordHash(h.n, leaf, h)
	if err != nil {
		return err
	}
	h.stored = append(h.stored, more...)
	h.n++
	return nil
}

// Set replaces the leaf at index, and every stored hash above it: O(log n). An auditor who holds a
// position in several copies (check.go, resolve) tries each against a signed root this way,
// instead of computing the tree again for each.
func (h *Hashes) Set(index int64, leaf tlog.Hash) error {
	if index < 0 || index >= h.n {
		return fmt.Errorf("no leaf %d in a tree of %d", index, h.n)
	}
	h.stored[tlog.StoredHashIndex(0, index)] = leaf
	for level := 1; ; level++ {
		node := index >> level
		if (node+1)<<level > h.n {
			return nil // the subtree is not complete: no hash of it is stored
		}
		left := h.stored[tlog.StoredHashIndex(level-1, 2*node)]
		right := h.stored[tlog.StoredHashIndex(level-1, 2*node+1)]
		h.stored[tlog.StoredHashIndex(level, node)] = tlog.NodeHash(left, right)
	}
}

// Size is the number of leaves added.
func (h *Hashes) Size() int64 { return h.n }

// ReadHashes is tlog.HashReader's: the stored hashes at the given indexes.
func (h *Hashes) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(h.stored)) {
			return nil, fmt.Errorf("no hash at stored index %d (%d stored)", x, len(h.stored))
		}
		out[i] = h.stored[x]
	}
	return out, nil
}

// Root is the root of the tree of the first size leaves.
func (h *Hashes) Root(size int64) (tlog.Hash, error) {
	if size > h.n {
		return tlog.Hash{}, fmt.Errorf("a root at size %d of a tree of %d leaves", size, h.n)
	}
	return tlog.TreeHash(size, h)
}

// Inclusion proves that leaf index is in the tree of the first size leaves.
func (h *Hashes) Inclusion(index, size int64) (tlog.RecordProof, error) {
	return tlog.ProveRecord(size, index, h)
}

// Consistency proves that the tree of the first size leaves extends that of the first old.
func (h *Hashes) Consistency(old, size int64) (tlog.TreeProof, error) {
	return tlog.ProveTree(size, old, h)
}

// Included checks that the message at sequence seq, with subject and body, is in the log c
// signs, by its inclusion proof: what an auditor does with a bundle and the public key alone.
func Included(c Checkpoint, seq uint64, subject string, body []byte, proof tlog.RecordProof) error {
	pos := Position(seq)
	if pos < 0 || pos >= c.Size {
		return fmt.Errorf("sequence %d is not among the %d records the checkpoint signs", seq, c.Size)
	}
	return tlog.CheckRecord(proof, c.Size, c.Root, pos, LeafHash(seq, subject, body))
}
