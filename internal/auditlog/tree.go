package auditlog

import (
	"fmt"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/tlog"
)

// Tree is the log's tree as its keeper holds it: the right edge only (a compact range, O(log n)
// hashes), enough to extend it and to compute its root, never reading the log again.
type Tree struct {
	r *compact.Range
}

func factory() *compact.RangeFactory {
	return &compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}
}

// NewTree is the tree of an empty log.
func NewTree() *Tree { return &Tree{r: factory().NewEmptyRange(0)} }

// ResumeTree is the tree a checkpoint states, from the right edge kept beside it. The edge is not
// signed: it must give the checkpoint's root, or it is refused.
func ResumeTree(c Checkpoint, edge []tlog.Hash) (*Tree, error) {
	hashes := make([][]byte, len(edge))
	for i := range edge {
		hashes[i] = edge[i][:]
	}
	r, err := factory().NewRange(0, uint64(c.Size), hashes)
	if err != nil {
		return nil, fmt.Errorf("the right edge kept with the checkpoint at size %d: %w", c.Size, err)
	}
	t := &Tree{r: r}
	if root, err := t.Root(); err != nil || root != c.Root {
		return nil, fmt.Errorf("the right edge kept with the checkpoint at size %d does not give its root", c.Size)
	}
	return t, nil
}

// Append adds the next leaf.
func (t *Tree) Append(leaf tlog.Hash) error { return t.r.Append(leaf[:], nil) }

// Size is the number of leaves.
func (t *Tree) Size() int64 { return int64(t.r.End()) }

// Root is the root of the tree (an empty tree has none worth signing: an error).
func (t *Tree) Root() (tlog.Hash, error) {
	if t.Size() == 0 {
		return tlog.Hash{}, fmt.Errorf("an empty log has no root to sign")
	}
	b, err := t.r.GetRootHash(nil)
	if err != nil {
		return tlog.Hash{}, err
	}
	var h tlog.Hash
	copy(h[:], b)
	return h, nil
}

// Edge is the right edge, kept beside each checkpoint so a keeper started again resumes from it.
func (t *Tree) Edge() []tlog.Hash {
	hs := t.r.Hashes()
	out := make([]tlog.Hash, len(hs))
	for i := range hs {
		copy(out[i][:], hs[i])
	}
	return out
}
