package rank

// Stored is one stored copy of an evaluation as ranking needs it. The same event id may be stored
// more than once (redeliveries, replays) until ClickHouse merges the copies.
type Stored struct {
	RoundScore
	Pos // where this copy is in the EVALUATIONS history
}

// Bound says which stored evaluations a reduction counts.
type Bound struct {
	// BeforeRound counts rounds below it only; 0 counts every round.
	BeforeRound int
	// UpTo counts copies at or before this position only, so that a prompt computed as of a
	// position gives the same result however much was stored since (docs/contract.md#read-your-writes).
	UpTo Pos
}

// Everything is the bound of the ranker's API: every round, every stored copy.
func Everything() Bound { return Bound{UpTo: End} }

func (b Bound) counts(r Stored) bool {
	return !r.Pos.After(b.UpTo) && (b.BeforeRound <= 0 || r.Round < b.BeforeRound)
}

// eventKey names one evaluation: an event id is deduplicated on its team (its subject).
type eventKey struct{ team, id string }

// Latest is the rule of which evaluation counts. It reduces stored rows of one execution to the
// latest evaluation of each (team, round) within b, in no particular order, and returns the
// highest position among the evaluations considered.
//
// Copies past b.UpTo are not seen at all. Copies of an event id on one team collapse to the first
// stored copy (the lowest position), even when a replay names another round;
// then the latest evaluation of a round wins: later evaluated_at, then the greater id. The result
// does not depend on the order of rows, so it does not depend on ClickHouse's merge state either
// (but for an id sent again to a stream made again: the merge keeps the copy with the lower
// sequence whatever its era, docs/reliability.md).
func Latest(rows []Stored, b Bound) ([]RoundScore, Pos) {
	copies, last := latestCopies(rows, b)
	out := make([]RoundScore, len(copies))
	for i, c := range copies {
		out[i] = c.RoundScore
	}
	return out, last
}

// latestCopies is Latest keeping each evaluation's first stored copy, whose position says where
// its content is in the EVALUATIONS stream.
func latestCopies(rows []Stored, b Bound) ([]Stored, Pos) {
	first := make(map[eventKey]Stored, len(rows))
	for _, r := range rows {
		if r.Pos.After(b.UpTo) {
			continue
		}
		k := eventKey{r.TeamID, r.EventID}
		if have, ok := first[k]; !ok || have.Pos.After(r.Pos) {
			first[k] = r
		}
	}
	type roundKey struct {
		team  string
		round int
	}
	latest := make(map[roundKey]Stored, len(first))
	var last Pos
	for _, r := range first {
		if !b.counts(r) {
			continue
		}
		if r.Pos.After(last) {
			last = r.Pos
		}
		k := roundKey{r.TeamID, r.Round}
		if have, ok := latest[k]; !ok || later(r.RoundScore, have.RoundScore) {
			latest[k] = r
		}
	}
	out := make([]Stored, 0, len(latest))
	for _, r := range latest {
		out = append(out, r)
	}
	return out, last
}

// later reports whether a is a later evaluation than b: later evaluated_at, then greater id.
func later(a, b RoundScore) bool {
	if a.AtMicros != b.AtMicros {
		return a.AtMicros > b.AtMicros
	}
	return a.EventID > b.EventID
}
