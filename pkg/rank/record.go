package rank

import "github.com/podium-llm/podium/pkg/events"

// Record is one accepted evaluation with where it came from.
type Record struct {
	EventID string
	Source  string
	Seq     uint64 // EVALUATIONS stream sequence
	Era     uint32 // of the stream (Pos)
	events.EvaluationCompleted
}

// Pos is where the record is in the EVALUATIONS history.
func (r Record) Pos() Pos { return Pos{Era: r.Era, Seq: r.Seq} }

// Board is a leaderboard with the highest position among the evaluations it reflects: Seq is
// the sequence in the EVALUATIONS stream of its era.
type Board struct {
	Rows []events.LeaderboardRow
	Pos
}

// TeamKey names one team of one execution.
type TeamKey struct{ ExecutionID, TeamID string }
