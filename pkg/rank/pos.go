package rank

import "math"

// Pos is a place in the history of evaluations: a sequence of the EVALUATIONS stream of one era.
// The stream deleted and made again starts a new era, whose sequences start over at 1: everything
// stored in an earlier era comes before anything of a later one, whatever the sequences say. Era 0
// is the stream the store was first derived from (rows stored before eras were counted).
type Pos struct {
	Era uint32
	Seq uint64
}

// End is after every position: a bound at End counts every stored copy.
var End = Pos{Era: math.MaxUint32, Seq: math.MaxUint64}

// Compare is -1, 0 or +1 as p is before, at or after q.
func (p Pos) Compare(q Pos) int {
	switch {
	case p.Era != q.Era:
		if p.Era < q.Era {
			return -1
		}
		return 1
	case p.Seq < q.Seq:
		return -1
	case p.Seq > q.Seq:
		return 1
	}
	return 0
}

// After reports whether p is after q.
func (p Pos) After(q Pos) bool { return p.Compare(q) > 0 }
