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

// RecordOf is the record of an evaluation read from EVALUATIONS (events.ParseEvaluation) at
// stream sequence seq of era: the one way a message becomes a record, for live writes, refills
// and reads of a prompt's content alike.
func RecordOf(ev events.Evaluation, seq uint64, era uint32) Record {
	return Record{EventID: ev.ID, Source: ev.Source, Seq: seq, Era: era, EvaluationCompleted: ev.Data}
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
