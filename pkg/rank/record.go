package rank

import "github.com/podium-llm/podium/pkg/events"

// Record is one accepted evaluation with where it came from.
type Record struct {
	EventID string
	Source  string
	Seq     uint64 // EVALUATIONS stream sequence
	events.EvaluationCompleted
}

// Board is a leaderboard with the highest EVALUATIONS sequence among the evaluations it reflects.
type Board struct {
	Rows []events.LeaderboardRow
	Seq  uint64
}

// TeamKey names one team of one execution.
type TeamKey struct{ ExecutionID, TeamID string }
