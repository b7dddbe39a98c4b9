package events

import (
	"fmt"
	"strings"
)

// MaxIdentifierLen bounds execution and team identifiers.
const MaxIdentifierLen = 128

// ValidIdentifier reports whether s can be an execution_id or team_id: 1-128 characters of
// [A-Za-z0-9_-], so it is always exactly one subject token.
func ValidIdentifier(s string) bool {
	if len(s) == 0 || len(s) > MaxIdentifierLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// identifierRule is the message shown when ValidIdentifier fails.
const identifierRule = "must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-'"

// EvaluationSubject is evaluation.completed.<execution_id>.<team_id>.
func EvaluationSubject(executionID, teamID string) string {
	return TypeEvaluationCompleted + "." + executionID + "." + teamID
}

// RoundSubject is round.requested.<execution_id>.<team_id>.
func RoundSubject(executionID, teamID string) string {
	return TypeRoundRequested + "." + executionID + "." + teamID
}

// PromptComposedSubject is prompt.composed.<execution_id>.<team_id>.
func PromptComposedSubject(executionID, teamID string) string {
	return TypePromptComposed + "." + executionID + "." + teamID
}

// PromptFailedSubject is prompt.failed.<execution_id>.<team_id>.
func PromptFailedSubject(executionID, teamID string) string {
	return TypePromptFailed + "." + executionID + "." + teamID
}

// PromptAnswerSubject is prompt.*.<execution_id>.<team_id>: the team's answers of either kind,
// prompt.composed and prompt.failed.
func PromptAnswerSubject(executionID, teamID string) string {
	return "prompt.*." + executionID + "." + teamID
}

// LeaderboardSubject is leaderboard.updated.<execution_id>.
func LeaderboardSubject(executionID string) string {
	return TypeLeaderboardUpdated + "." + executionID
}

// DeadLetterSubject is deadletter.<original subject>.
func DeadLetterSubject(original string) string {
	return "deadletter." + original
}

// Address is what a team-scoped subject names.
type Address struct {
	Type        string
	ExecutionID string
	TeamID      string
}

// ParseTeamSubject splits "<type>.<execution_id>.<team_id>" for the given type and checks both
// identifiers. It is how a service learns whom to answer before it trusts the body.
func ParseTeamSubject(eventType, subject string) (Address, error) {
	rest, ok := strings.CutPrefix(subject, eventType+".")
	if !ok {
		return Address{}, fmt.Errorf("subject %q is not under %s.>", subject, eventType)
	}
	exec, team, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(team, ".") {
		return Address{}, fmt.Errorf("subject %q must be %s.<execution_id>.<team_id>", subject, eventType)
	}
	if !ValidIdentifier(exec) {
		return Address{}, fmt.Errorf("subject %q: execution_id %s", subject, identifierRule)
	}
	if !ValidIdentifier(team) {
		return Address{}, fmt.Errorf("subject %q: team_id %s", subject, identifierRule)
	}
	return Address{Type: eventType, ExecutionID: exec, TeamID: team}, nil
}

// SubjectCommitted is where the ranker says, on core NATS (nothing stores it), that it has
// committed evaluations: the body is a Committed. Composers wake on it instead of polling the
// ranker's ack floor; they still check the floor, so a notice lost or early changes nothing but
// latency.
const SubjectCommitted = "ranker.committed"

// Committed is the body of a SubjectCommitted notice: the highest EVALUATIONS sequence of the
// batch just committed.
type Committed struct {
	EvaluationsSeq uint64 `json:"evaluations_seq"`
}
