// Package events is the wire contract of the pipeline: the CloudEvents envelope, the five event
// bodies, subjects, stream and consumer configurations, validation of incoming events and the
// helpers that publish and dead-letter them. It is shared by every service and imports none of
// them, so the contract lives in exactly one place.
package events

import (
	"encoding/json"
	"time"
)

// Event types, as carried in the envelope's "type" attribute and as the first two subject tokens.
const (
	TypeEvaluationCompleted = "evaluation.completed"
	TypeRoundRequested      = "round.requested"
	TypePromptComposed      = "prompt.composed"
	TypePromptFailed        = "prompt.failed"
	TypeLeaderboardUpdated  = "leaderboard.updated"
)

// SpecVersion is the only CloudEvents version accepted and produced.
const SpecVersion = "1.0"

// ContentType is the structured-mode CloudEvents media type sent as the Content-Type header.
const ContentType = "application/cloudevents+json"

// DefaultMaxEventBytes is the default body limit, the NATS default max payload.
const DefaultMaxEventBytes = 1 << 20

// Envelope is a CloudEvents 1.0 event in structured JSON mode, as read.
type Envelope = envelope[json.RawMessage]

// envelope is written with the data as a value (Marshal) and read with it raw (Envelope).
type envelope[D any] struct {
	SpecVersion     string `json:"specversion"`
	ID              string `json:"id"`
	Source          string `json:"source"`
	Type            string `json:"type"`
	Time            string `json:"time"`
	DataContentType string `json:"datacontenttype,omitempty"`
	// The CloudEvents distributed-tracing extension: W3C trace context of the producing span.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
	Data        D      `json:"data"`
}

// Meta is the validated part of an incoming envelope that handlers need.
type Meta struct {
	ID     string
	Source string
	Type   string
	Time   time.Time    // with the offset the producer sent
	Trace  TraceContext // as the envelope carries it, unchecked: a malformed one is ignored, never refused
}

// TraceContext is W3C trace context as events carry it (docs/contract.md#envelope): the CloudEvents
// distributed-tracing attributes traceparent and tracestate in the envelope, and the same names
// as NATS headers. The envelope wins when both are present.
type TraceContext struct {
	Parent string // traceparent: version-traceid-parentid-flags
	State  string // tracestate: vendor entries
}

// TraceOf reads the trace context an event's envelope carries, without validating the event: the
// consumer runtime starts a message's span from it before the handler parses the event (an
// invalid event gets a span too). A body that is not a JSON object carries none.
func TraceOf(body []byte) TraceContext {
	var env struct {
		TraceParent string `json:"traceparent"`
		TraceState  string `json:"tracestate"`
	}
	if json.Unmarshal(body, &env) != nil {
		return TraceContext{}
	}
	return TraceContext{Parent: env.TraceParent, State: env.TraceState}
}

// NATS header names of trace context (W3C Trace Context).
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Evaluation is a validated evaluation.completed event.
type Evaluation struct {
	Meta
	Data EvaluationCompleted
}

// RoundRequest is a validated round.requested event.
type RoundRequest struct {
	Meta
	Data RoundRequested
}

// EvaluationCompleted is the data of evaluation.completed.
type EvaluationCompleted struct {
	ExecutionID string     `json:"execution_id"`
	TeamID      string     `json:"team_id"`
	TeamName    string     `json:"team_name"`
	RoundNumber int        `json:"round_number"`
	Submission  Submission `json:"submission"`
	Evaluation  Scores     `json:"evaluation"`
	EvaluatedAt time.Time  `json:"evaluated_at"`
}

// Submission is what a team handed in, kept whole.
type Submission struct {
	Content string `json:"content"`
	Format  string `json:"format,omitempty"`
}

// Scores is the evaluator's verdict on one submission.
type Scores struct {
	OverallScore float64  `json:"overall_score"`
	Metrics      []Metric `json:"metrics"`
	Feedback     string   `json:"feedback,omitempty"`
}

// Metric is one named score with the evaluator's comment.
type Metric struct {
	MetricName       string  `json:"metric_name"`
	Score            float64 `json:"score"`
	EvaluatorComment string  `json:"evaluator_comment"`
}

// RoundRequested is the data of round.requested.
type RoundRequested struct {
	ExecutionID string         `json:"execution_id"`
	TeamID      string         `json:"team_id"`
	TeamName    string         `json:"team_name"`
	RoundNumber int            `json:"round_number"`
	UserPrompt  string         `json:"user_prompt"`
	Template    string         `json:"template,omitempty"`
	Model       string         `json:"model,omitempty"`
	Timezone    string         `json:"timezone,omitempty"`
	MaxRounds   int            `json:"max_rounds,omitempty"` // 0 when not sent
	ScoreOrder  ScoreOrder     `json:"score_order,omitempty"`
	Limits      Limits         `json:"limits"`
	Standings   Standings      `json:"standings,omitempty"` // "" means Live
	Vars        map[string]any `json:"vars,omitempty"`      // numbers are json.Number, so they render as sent
}

// Limits override a template's defaults; nil means "not sent".
type Limits struct {
	HistoryRounds    *int `json:"history_rounds,omitempty"`
	LeaderboardTeams *int `json:"leaderboard_teams,omitempty"`
	PreviewChars     *int `json:"preview_chars,omitempty"`
	MaxPromptTokens  *int `json:"max_prompt_tokens,omitempty"`
}

// ScoreOrder says whether a higher or a lower score is better.
type ScoreOrder string

// Score orders. The zero value means Desc.
const (
	Desc ScoreOrder = "desc"
	Asc  ScoreOrder = "asc"
)

// ParseScoreOrder accepts "", "desc" and "asc".
func ParseScoreOrder(s string) (ScoreOrder, bool) { return parseEnum(s, Desc, Asc) }

// Standings says which evaluations a prompt's leaderboard counts (docs/contract.md#read-your-writes).
type Standings string

// Standings modes. The zero value means Live.
const (
	// Live counts every evaluation of the execution committed before the request, whatever its
	// round, as mixseek-core does for teams that run asynchronously.
	Live Standings = "live"
	// BeforeRound counts rounds below the requested one only: the same board for every team of a
	// synchronized round.
	BeforeRound Standings = "before_round"
)

// ParseStandings accepts "", "live" and "before_round".
func ParseStandings(s string) (Standings, bool) { return parseEnum(s, Live, BeforeRound) }

// parseEnum accepts "" (the zero value, which means def), def and each of others.
func parseEnum[T ~string](s string, def T, others ...T) (T, bool) {
	if s == "" || s == string(def) {
		return def, true
	}
	for _, o := range others {
		if s == string(o) {
			return o, true
		}
	}
	return "", false
}

// LeaderboardRow is one team's standing in an execution (docs/contract.md#ranking).
type LeaderboardRow struct {
	Position  int     `json:"position"`
	Rank      int     `json:"rank"`
	TeamID    string  `json:"team_id"`
	TeamName  string  `json:"team_name"`
	BestScore float64 `json:"best_score"`
	BestRound int     `json:"best_round"`
	Rounds    int     `json:"rounds"`
}

// TeamRound is the latest evaluation of one round of one team, as the history endpoint and the
// composer see it.
type TeamRound struct {
	RoundNumber  int        `json:"round_number"`
	EvaluationID string     `json:"evaluation_id"`
	OverallScore float64    `json:"overall_score"`
	Metrics      []Metric   `json:"metrics"`
	Feedback     string     `json:"feedback"`
	Submission   Submission `json:"submission"`
	EvaluatedAt  string     `json:"evaluated_at"` // as the evaluator sent it
}

// PromptComposed is the data of prompt.composed.
type PromptComposed struct {
	RequestID     string        `json:"request_id"`
	ExecutionID   string        `json:"execution_id"`
	TeamID        string        `json:"team_id"`
	TeamName      string        `json:"team_name"`
	RoundNumber   int           `json:"round_number"`
	Prompt        string        `json:"prompt"`
	Messages      []Message     `json:"messages,omitempty"`
	PromptSHA256  string        `json:"prompt_sha256"`
	Template      TemplateRef   `json:"template"`
	Model         string        `json:"model,omitempty"`
	TokenEstimate int           `json:"token_estimate"`
	TokenEncoding string        `json:"token_encoding"`
	Truncated     []Truncation  `json:"truncated"`
	Inputs        ComposeInputs `json:"inputs"`
	// Request is what the prompt was rendered from (a compatible addition): with the template
	// version and inputs.evaluations_seq, an auditor renders the record again from itself.
	Request *RequestRecord `json:"request,omitempty"`
	// Builder is the prompt builder that built the prompt, or that failed and left it to the
	// template (Fallback, with its Reason): a compatible addition (docs/builders.md).
	Builder *BuilderRef `json:"builder,omitempty"`
	// Params are the builder's hints for the model (a recommended temperature), as it gave them.
	Params map[string]any `json:"params,omitempty"`
}

// BuilderRef names a prompt builder's version as a record does.
type BuilderRef struct {
	Name     string `json:"name"`
	Version  int    `json:"version"`
	SHA256   string `json:"sha256"` // of the module's bytes
	Fallback bool   `json:"fallback"`
	Reason   string `json:"reason,omitempty"` // why it fell back
}

// RequestRecord is a round request as a prompt.composed records it.
type RequestRecord struct {
	Time string         `json:"time"` // the envelope time, RFC 3339 in UTC at microseconds
	Data RoundRequested `json:"data"`
}

// Message is one chat message of a template that defines roles.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// TemplateRef names the exact template that rendered a prompt.
type TemplateRef struct {
	Name     string `json:"name"`
	Version  int    `json:"version"`
	SHA256   string `json:"sha256"`
	Variant  string `json:"variant,omitempty"`
	Fallback bool   `json:"fallback"`
	// Label is the registry label the request's template resolved through (production for a bare
	// name), when it did: with a label split between versions, the record says which label and
	// which version the team was served (a compatible addition).
	Label string `json:"label,omitempty"`
	// Split is the label's versions and weights when it split between versions ("5=50,6=50"), as
	// they stood when this request was served (a compatible addition): a team's first record says
	// the weights that assigned it, and teams first served under different weights are compared
	// only with their own (docs/templates.md).
	Split string `json:"split,omitempty"`
}

// Truncation records one cut the budget made.
type Truncation struct {
	Section string `json:"section"`
	Detail  string `json:"detail"`
}

// ComposeInputs records what a prompt was built from, for audit and replay.
type ComposeInputs struct {
	EvaluationIDs  []string         `json:"evaluation_ids"`
	HistoryRounds  []int            `json:"history_rounds"`
	Leaderboard    []LeaderboardRow `json:"leaderboard"`
	TeamPosition   *int             `json:"team_position"`
	TeamCount      int              `json:"team_count"`
	EvaluationsSeq uint64           `json:"evaluations_seq"`
	// EvaluationsEra is the era of the EVALUATIONS stream EvaluationsSeq is a sequence of (a
	// compatible addition; absent: era 0): the stream deleted and made again starts a new era,
	// and a prompt counts every evaluation of earlier eras (docs/contract.md#read-your-writes).
	EvaluationsEra uint32 `json:"evaluations_era,omitempty"`
}

// PromptFailed is the data of prompt.failed.
type PromptFailed struct {
	RequestID   string      `json:"request_id"`
	ExecutionID string      `json:"execution_id"`
	TeamID      string      `json:"team_id"`
	RoundNumber int         `json:"round_number"`
	Code        FailureCode `json:"code"`
	Message     string      `json:"message"`
	Retryable   bool        `json:"retryable"`
	// Template is the template version the request was assigned (name, version, sha256, and the
	// label and split that assigned it) when it failed after one was (a compatible addition):
	// `templates compare` counts the failure against that version, and a team whose every request
	// failed is still one of its teams. Nil when the request failed before one was: invalid_request,
	// unknown_template, inputs_not_ready (the wait comes first), or store_unavailable while the
	// version was being chosen.
	Template *TemplateRef `json:"template,omitempty"`
}

// LeaderboardUpdated is the data of leaderboard.updated.
type LeaderboardUpdated struct {
	ExecutionID    string           `json:"execution_id"`
	Leaderboard    []LeaderboardRow `json:"leaderboard"`
	EvaluationsSeq uint64           `json:"evaluations_seq"`
	// EvaluationsEra is the era of EvaluationsSeq's stream, as in ComposeInputs (absent: 0).
	EvaluationsEra uint32 `json:"evaluations_era,omitempty"`
	// Truncated is set (a compatible addition) when the whole board would not fit in one message:
	// Leaderboard holds its first Shown rows of Teams. The ranker's API serves the whole board.
	Truncated *BoardTruncation `json:"truncated,omitempty"`
}

// BoardTruncation says how much of a board an announcement could carry.
type BoardTruncation struct {
	Teams int `json:"teams"` // rows of the whole board
	Shown int `json:"shown"` // the first rows, in board order, that the announcement carries
}
