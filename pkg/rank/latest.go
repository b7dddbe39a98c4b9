package rank

import "math"

// Stored is one stored copy of an evaluation as ranking needs it. The same event id may be stored
// more than once (redeliveries, replays) until ClickHouse merges the copies.
type Stored struct {
	RoundScore
	Seq uint64 // EVALUATIONS stream sequence of this copy
}

// AllSeqs is the UpToSeq of a Bound that counts every stored copy.
const AllSeqs = math.MaxUint64

// Bound says which stored evaluations a reduction counts.
type Bound struct {
	// BeforeRound counts rounds below it only; 0 counts every round.
	BeforeRound int
	// UpToSeq counts copies with an EVALUATIONS sequence up to it only, so that a prompt computed
	// as of a sequence gives the same result however much was stored since (docs/contract.md#read-your-writes).
	UpToSeq uint64
}

// Everything is the bound of the ranker's API: every round, every stored copy.
func Everything() Bound { return Bound{UpToSeq: AllSeqs} }

func (b Bound) counts(r Stored) bool {
	return r.Seq <= b.UpToSeq && (b.BeforeRound <= 0 || r.Round < b.BeforeRound)
}

// eventKey names one evaluation: an event id is deduplicated on its team (its subject).
type eventKey struct{ team, id string }

// Latest is the rule of which evaluation counts. It reduces stored rows of one execution to the
// latest evaluation of each (team, round) within b, in no particular order, and returns the
// highest stream sequence among the evaluations considered.
//
// Copies with a sequence past b.UpToSeq are not seen at all. Copies of an event id on one team
// collapse to the first stored copy (lowest sequence), even when a replay names another round;
// then the latest evaluation of a round wins: later evaluated_at, then the greater id. The result
// does not depend on the order of rows, so it does not depend on ClickHouse's merge state either.
func Latest(rows []Stored, b Bound) ([]RoundScore, uint64) {
	copies, seq := latestCopies(rows, b)
	out := make([]RoundScore, len(copies))
	for i, c := range copies {
		out[i] = c.RoundScore
	}
	return out, seq
}

// latestCopies is Latest keeping each evaluation's first stored copy, whose sequence says where
// its content is in the EVALUATIONS stream.
func latestCopies(rows []Stored, b Bound) ([]Stored, uint64) {
	first := make(map[eventKey]Stored, len(rows))
	for _, r := range rows {
		if r.Seq > b.UpToSeq {
			continue
		}
		k := eventKey{r.TeamID, r.EventID}
		if have, ok := first[k]; !ok || r.Seq < have.Seq {
			first[k] = r
		}
	}
	type roundKey struct {
		team  string
		round int
	}
	latest := make(map[roundKey]Stored, len(first))
	var seq uint64
	for _, r := range first {
		if !b.counts(r) {
			continue
		}
		seq = max(seq, r.Seq)
		k := roundKey{r.TeamID, r.Round}
		if have, ok := latest[k]; !ok || later(r.RoundScore, have.RoundScore) {
			latest[k] = r
		}
	}
	out := make([]Stored, 0, len(latest))
	for _, r := range latest {
		out = append(out, r)
	}
	return out, seq
}

// later reports whether a is a later evaluation than b: later evaluated_at, then greater id.
func later(a, b RoundScore) bool {
	if a.AtMicros != b.AtMicros {
		return a.AtMicros > b.AtMicros
	}
	return a.EventID > b.EventID
}
