package rank

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// Evaluations are the stored score rows of one execution, every team and copy, as one read
// returns them: enough to rank it and to know each team's rounds at any bound. The composer
// reads them once for a whole round of requests; content is read per team (Content).
type Evaluations struct {
	rows []Stored

	mu      sync.Mutex
	reduced map[Bound]*Reduction // every team of a round asks for the same bounds
}

func newEvaluations() *Evaluations { return &Evaluations{reduced: map[Bound]*Reduction{}} }

// NewEvaluations holds score rows as a read of the store returns them (every copy; Latest
// decides which count), for the store's reads to fill with Append.
func NewEvaluations() *Evaluations { return newEvaluations() }

// Append adds a stored row; call it before the evaluations are read.
func (ev *Evaluations) Append(r Stored) { ev.rows = append(ev.rows, r) }

// HoldsEras reports whether a stored copy is of an era from from to to (both included).
func (ev *Evaluations) HoldsEras(from, to uint32) bool {
	for _, r := range ev.rows {
		if r.Era >= from && r.Era <= to {
			return true
		}
	}
	return false
}

// Span is the stored copies at the earliest and the latest position; false when there is none.
func (ev *Evaluations) Span() (first, last Stored, ok bool) {
	for i, r := range ev.rows {
		if i == 0 || r.Pos.Compare(first.Pos) < 0 {
			first = r
		}
		if i == 0 || r.Pos.After(last.Pos) {
			last = r
		}
	}
	return first, last, len(ev.rows) > 0
}

// Bytes approximates the memory the evaluations hold, for caches that bound it: the rows and
// every reduction kept for later callers (each a copy of the rows it counts).
func (ev *Evaluations) Bytes() int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := len(ev.rows) * 128
	for _, r := range ev.reduced {
		n += len(r.rounds)*112 + len(r.firsts)*16 + 64
	}
	return n
}

// Content is what one team submitted and was told: the first stored copy of each of its events
// (the copy Latest keeps), read only for the rounds a prompt can print.
type Content struct {
	byEvent map[string]firstCopy
}

type firstCopy struct {
	pos   Pos
	round events.TeamRound
}

func newContent() *Content { return &Content{byEvent: map[string]firstCopy{}} }

// Len is the number of evaluations the content holds.
func (c *Content) Len() int { return len(c.byEvent) }

// Has reports whether the content holds a copy of the event at or before p: a later copy read
// from the store then changes nothing, and need not be decoded.
func (c *Content) Has(eventID string, p Pos) bool {
	have, ok := c.byEvent[eventID]
	return ok && !have.pos.After(p)
}

// Keep keeps a stored copy of an event, as a read of the store returns it: the copy with the
// lowest position wins.
func (c *Content) Keep(eventID string, p Pos, d events.TeamRound) { c.add(eventID, p, d) }

// add keeps the copy of an event with the lowest position.
func (c *Content) add(eventID string, p Pos, d events.TeamRound) {
	if have, ok := c.byEvent[eventID]; ok && !have.pos.After(p) {
		return
	}
	c.byEvent[eventID] = firstCopy{pos: p, round: d}
}

// Reduction is an execution's evaluations within one Bound, reduced by Latest: its leaderboard
// and every team's rounds.
type Reduction struct {
	rounds []RoundScore // the latest evaluation of each (team, round), by team then round
	firsts []Pos        // rounds[i]'s first stored copy: its position
	last   Pos
}

// Rounds are the counted evaluations of the reduction, by team then round: every cell of an
// execution's rounds x teams grid that has a score. Callers must not modify them.
func (r *Reduction) Rounds() []RoundScore { return r.rounds }

// Reduce applies Latest within b. The result is shared by every caller asking for the same bound.
func (ev *Evaluations) Reduce(b Bound) *Reduction {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if r, ok := ev.reduced[b]; ok {
		return r
	}
	copies, last := latestCopies(ev.rows, b)
	slices.SortFunc(copies, func(a, b Stored) int {
		return cmp.Or(cmp.Compare(a.TeamID, b.TeamID), cmp.Compare(a.Round, b.Round))
	})
	r := &Reduction{rounds: make([]RoundScore, len(copies)), firsts: make([]Pos, len(copies)), last: last}
	for i, c := range copies {
		r.rounds[i], r.firsts[i] = c.RoundScore, c.Pos
	}
	ev.reduced[b] = r
	return r
}

// ContentRef names where an evaluation's content is: its event id and the position of its first
// stored copy, the copy whose content counts (Content keeps the same one).
type ContentRef struct {
	EventID string
	Round   int
	Pos
}

// ContentRefs are the team's counted evaluations of rounds from to before-1 (before 0: every
// round), ascending.
func (r *Reduction) ContentRefs(teamID string, from, before int) []ContentRef {
	byTeam := func(rs RoundScore, team string) int { return cmp.Compare(rs.TeamID, team) }
	i, _ := slices.BinarySearchFunc(r.rounds, teamID, byTeam)
	var refs []ContentRef
	for ; i < len(r.rounds) && r.rounds[i].TeamID == teamID; i++ {
		if rs := r.rounds[i]; rs.Round >= from && (before <= 0 || rs.Round < before) {
			refs = append(refs, ContentRef{EventID: rs.EventID, Round: rs.Round, Pos: r.firsts[i]})
		}
	}
	return refs
}

// Leaderboard ranks the reduction (docs/contract.md#ranking).
func (r *Reduction) Leaderboard(order events.ScoreOrder) Board {
	return Board{Rows: Rank(r.rounds, order), Pos: r.last}
}

// History returns a team's rounds, ascending, with their content where content holds it (nil:
// none); a round without content has its number, evaluation id and score only. Metrics are
// shared with content: callers must not modify them.
func (r *Reduction) History(teamID string, content *Content) []events.TeamRound {
	byTeam := func(rs RoundScore, team string) int { return cmp.Compare(rs.TeamID, team) }
	from, _ := slices.BinarySearchFunc(r.rounds, teamID, byTeam)
	out := []events.TeamRound{}
	for _, rs := range r.rounds[from:] {
		if rs.TeamID != teamID {
			break
		}
		tr := events.TeamRound{RoundNumber: rs.Round, EvaluationID: rs.EventID, OverallScore: rs.Score}
		if content != nil {
			// The first copy decides an event's round; a replay naming another round is another
			// copy, whose content does not belong here.
			if c, ok := content.byEvent[rs.EventID]; ok && c.round.RoundNumber == rs.Round {
				tr = c.round
			}
		}
		out = append(out, tr)
	}
	return out
}

// FromRecords builds, in memory, what reads of the store would return for these records of one
// execution: its score rows and each team's content. It serves offline rendering (podium
// templates render), so an author sees the prompt the composer would make from the same data.
func FromRecords(recs []Record) (*Evaluations, map[TeamKey]*Content) {
	ev := newEvaluations()
	contents := map[TeamKey]*Content{}
	for _, r := range recs {
		ev.rows = append(ev.rows, Stored{RoundScore: RoundScore{TeamID: r.TeamID, TeamName: r.TeamName, Round: r.RoundNumber,
			Score: r.Evaluation.OverallScore, AtMicros: r.EvaluatedAt.UnixMicro(), EventID: r.EventID}, Pos: r.Pos()})
		k := TeamKey{ExecutionID: r.ExecutionID, TeamID: r.TeamID}
		if contents[k] == nil {
			contents[k] = newContent()
		}
		contents[k].Add(r)
	}
	return ev, contents
}

// NewContent is an empty Content, for content read elsewhere than ClickHouse (the EVALUATIONS
// stream): Add fills it.
func NewContent() *Content { return newContent() }

// Add keeps what the evaluation r says, exactly as a read of its stored row would (the first
// copy of an event id wins): the stored columns are made from the same record.
func (c *Content) Add(r Record) {
	metrics := r.Evaluation.Metrics
	if metrics == nil {
		metrics = []events.Metric{}
	}
	c.add(r.EventID, r.Pos(), events.TeamRound{RoundNumber: r.RoundNumber, EvaluationID: r.EventID,
		OverallScore: r.Evaluation.OverallScore, Metrics: metrics, Feedback: r.Evaluation.Feedback,
		Submission: r.Submission, EvaluatedAt: r.EvaluatedAt.Format(time.RFC3339Nano)})
}
