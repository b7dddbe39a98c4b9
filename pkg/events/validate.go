package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Problem is one violation of the contract, located by a JSON path such as
// "data.evaluation.metrics[0].score" ("" is the body as a whole, "subject" the NATS subject).
type Problem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// InvalidError lists every problem found in one event. Invalid events are poison: they are never
// retried, only dead-lettered.
type InvalidError struct {
	Problems []Problem
}

func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "invalid event: " + strings.Join(parts, "; ")
}

// IsInvalid reports whether err says the event itself is bad (as opposed to a failure to process
// a good one).
func IsInvalid(err error) bool {
	var ie *InvalidError
	return errors.As(err, &ie)
}

// MaxRoundNumber keeps round numbers inside the UInt32 column and the JSON Schema's bound.
const MaxRoundNumber = math.MaxInt32

// ParseEvaluation validates an evaluation.completed body received on subject and returns it typed.
func ParseEvaluation(subject string, body []byte, maxBytes int) (Evaluation, error) {
	meta, data, err := parseTeamEvent(TypeEvaluationCompleted, subject, body, maxBytes, (*checker).evaluationCompleted,
		func(d EvaluationCompleted) (string, string) { return d.ExecutionID, d.TeamID })
	return Evaluation{Meta: meta, Data: data}, err
}

// ParseRoundRequest validates a round.requested body received on subject and returns it typed.
func ParseRoundRequest(subject string, body []byte, maxBytes int) (RoundRequest, error) {
	meta, data, err := parseTeamEvent(TypeRoundRequested, subject, body, maxBytes, (*checker).roundRequested,
		func(d RoundRequested) (string, string) { return d.ExecutionID, d.TeamID })
	return RoundRequest{Meta: meta, Data: data}, err
}

// parseTeamEvent validates an event of one team: its envelope, its data (read), and that the
// subject names the data's execution and team (address). What was read is returned with the
// error, so a caller can still name the event it refuses.
func parseTeamEvent[D any](eventType, subject string, body []byte, maxBytes int, read func(*checker, map[string]any, string) D, address func(D) (exec, team string)) (Meta, D, error) {
	var c checker
	meta, m := c.envelope(eventType, subject, body, maxBytes)
	var data D
	if m != nil {
		data = read(&c, m, "data")
		exec, team := address(data)
		c.subjectAgrees(subject, eventType, exec, team)
	}
	return meta, data, c.err()
}

// RenderRequest is a validated body of POST /v1/render (docs/contract.md#http-and-nats-services).
type RenderRequest struct {
	Data      RoundRequested
	Time      time.Time // zero when absent: the caller then uses the current time
	RequestID string    // "" when absent
	// EvaluationsSeq, when set, renders as of that EVALUATIONS sequence instead of the latest,
	// so an audit record can be rendered again exactly; EvaluationsEra is the era of its stream
	// (as the record's inputs.evaluations_era; absent: 0).
	EvaluationsSeq *uint64
	EvaluationsEra uint32
}

// ParseRenderRequest validates the body of POST /v1/render: a round.requested data object with an
// optional "time" (RFC 3339), "request_id" and "evaluations_seq".
func ParseRenderRequest(body []byte, maxBytes int) (RenderRequest, error) {
	var c checker
	m := c.decodeObject(body, maxBytes, "the data of a round.requested")
	if m == nil {
		return RenderRequest{}, c.err()
	}
	r := RenderRequest{Data: c.roundRequested(m, "")}
	if _, ok := m["time"]; ok {
		r.Time = c.timestamp(m, "", "time")
	}
	r.RequestID, _ = c.str(m, "", "request_id", false)
	if r.RequestID != "" && !ValidEventID(r.RequestID) {
		c.add("request_id", "must be 1-128 printable ASCII characters")
	}
	if v, ok := c.get(m, "", "evaluations_seq", false); ok {
		// From the number's text: through a float64, sequences past 2^53 would change.
		n, isNum := v.(json.Number)
		seq, err := strconv.ParseUint(string(n), 10, 64)
		switch {
		case !isNum:
			c.add("evaluations_seq", fmt.Sprintf("must be a whole number from 0 to %d, got %s", uint64(math.MaxUint64), JSONKind(v)))
		case err != nil:
			c.add("evaluations_seq", fmt.Sprintf("must be a whole number from 0 to %d, got %s", uint64(math.MaxUint64), cut(string(n))))
		default:
			r.EvaluationsSeq = &seq
		}
	}
	if v, ok := c.get(m, "", "evaluations_era", false); ok {
		n, isNum := v.(json.Number)
		era, err := strconv.ParseUint(string(n), 10, 32)
		switch {
		case !isNum || err != nil:
			c.add("evaluations_era", fmt.Sprintf("must be a whole number from 0 to %d, got %s", uint32(math.MaxUint32), cut(fmt.Sprint(v))))
		case r.EvaluationsSeq == nil:
			c.add("evaluations_era", "is a position's era: it needs evaluations_seq")
		default:
			r.EvaluationsEra = uint32(era)
		}
	}
	return r, c.err()
}

// maxQuoted is how much of a value an error message echoes: enough to recognize it, never the
// whole of a hostile megabyte.
const maxQuoted = 64

// Quote quotes a value for an error message, cut to its first maxQuoted bytes ("…" follows).
func Quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(strings.ToValidUTF8(s[:maxQuoted], "")) + "…"
	}
	return strconv.Quote(s)
}

// cut is Quote without the quotes, for numbers.
func cut(s string) string {
	if len(s) > maxQuoted {
		return s[:maxQuoted] + "…"
	}
	return s
}

// Validate checks any of the five event types against the contract; the type is taken from the
// subject. Consumers of the pipeline's output (and its tests) use it on what the services publish.
func Validate(subject string, body []byte, maxBytes int) error {
	var c checker
	eventType := subjectType(subject)
	if eventType == "" {
		c.add("subject", fmt.Sprintf("%s is not the subject of a known event type", Quote(subject)))
		return c.err()
	}
	_, data := c.envelope(eventType, subject, body, maxBytes)
	if data == nil {
		return c.err()
	}
	switch eventType {
	case TypeEvaluationCompleted:
		d := c.evaluationCompleted(data, "data")
		c.subjectAgrees(subject, eventType, d.ExecutionID, d.TeamID)
	case TypeRoundRequested:
		d := c.roundRequested(data, "data")
		c.subjectAgrees(subject, eventType, d.ExecutionID, d.TeamID)
	case TypePromptComposed:
		exec, team := c.promptComposed(data, "data")
		c.subjectAgrees(subject, eventType, exec, team)
	case TypePromptFailed:
		exec, team := c.promptFailed(data, "data")
		c.subjectAgrees(subject, eventType, exec, team)
	case TypeLeaderboardUpdated:
		exec := c.leaderboardUpdated(data, "data")
		if want := LeaderboardSubject(exec); exec != "" && subject != want {
			c.add("subject", fmt.Sprintf("%s does not match the body, which names %s", Quote(subject), Quote(want)))
		}
	}
	return c.err()
}

func subjectType(subject string) string {
	for _, t := range []string{TypeEvaluationCompleted, TypeRoundRequested, TypePromptComposed, TypePromptFailed, TypeLeaderboardUpdated} {
		if strings.HasPrefix(subject, t+".") {
			return t
		}
	}
	return ""
}

// checker accumulates problems while it walks a decoded JSON tree, so one pass reports them all.
type checker struct {
	problems []Problem
}

func (c *checker) add(path, msg string) { c.problems = append(c.problems, Problem{path, msg}) }

func (c *checker) err() error {
	if len(c.problems) == 0 {
		return nil
	}
	return &InvalidError{Problems: c.problems}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decodeObject checks size, UTF-8 and JSON syntax and returns the top-level object, or nil.
func (c *checker) decodeObject(body []byte, maxBytes int, what string) map[string]any {
	if maxBytes > 0 && len(body) > maxBytes {
		c.add("", fmt.Sprintf("body is %d bytes, over the limit of %d (MAX_EVENT_BYTES)", len(body), maxBytes))
		return nil
	}
	if !utf8.Valid(body) {
		c.add("", "body is not valid UTF-8")
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		c.add("", "body is not JSON: "+err.Error())
		return nil
	}
	if _, err := dec.Token(); err == nil {
		c.add("", "body has data after the JSON value")
		return nil
	}
	m, ok := root.(map[string]any)
	if !ok {
		c.add("", "body must be a JSON object ("+what+"), got "+JSONKind(root))
		return nil
	}
	return m
}

// envelope checks the body as a whole and the CloudEvents attributes, and returns the data object
// (nil when there is none to check further).
func (c *checker) envelope(eventType, subject string, body []byte, maxBytes int) (Meta, map[string]any) {
	var meta Meta
	m := c.decodeObject(body, maxBytes, "a CloudEvent in structured mode")
	if m == nil {
		return meta, nil
	}
	if v, ok := c.str(m, "", "specversion", true); ok && v != SpecVersion {
		c.add("specversion", fmt.Sprintf("must be %s, got %s", Quote(SpecVersion), Quote(v)))
	}
	if v, ok := c.str(m, "", "id", true); ok {
		if !ValidEventID(v) {
			c.add("id", "must be 1-128 printable ASCII characters")
		}
		meta.ID = v
	}
	if v, ok := c.str(m, "", "source", true); ok {
		if _, err := url.Parse(v); v == "" || err != nil || !uriReference(v) {
			c.add("source", "must be a non-empty URI-reference")
		}
		meta.Source = v
	}
	if v, ok := c.str(m, "", "type", true); ok {
		if v != eventType {
			c.add("type", fmt.Sprintf("must be %s on subject %s, got %s", Quote(eventType), Quote(subject), Quote(v)))
		}
		meta.Type = v
	}
	meta.Time = c.timestamp(m, "", "time")
	if v, ok := c.str(m, "", "datacontenttype", false); ok {
		if _, _, err := mime.ParseMediaType(v); err != nil || !mediaType.MatchString(v) {
			c.add("datacontenttype", fmt.Sprintf("must be \"application/json\" when present, got %s", Quote(v)))
		}
	}
	// Trace context is taken as it is: a malformed or non-string value is ignored downstream,
	// never a reason to refuse the event (docs/contract.md#envelope).
	// A value that is not a string is kept as its text, so it is counted as malformed.
	if v, ok := m["traceparent"]; ok && v != nil {
		meta.Trace.Parent = fmt.Sprint(v)
	}
	meta.Trace.State, _ = m["tracestate"].(string)
	data := c.object(m, "", "data", true)
	return meta, data
}

// ValidEventID reports whether s is a valid CloudEvents id here: 1-128 printable ASCII characters.
func ValidEventID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// subjectAgrees reports a subject whose tokens differ from the body's identifiers. Identifiers
// that are themselves invalid were reported already and are not compared again.
func (c *checker) subjectAgrees(subject, eventType, exec, team string) {
	addr, err := ParseTeamSubject(eventType, subject)
	if err != nil {
		c.add("subject", err.Error())
		return
	}
	if ValidIdentifier(exec) && exec != addr.ExecutionID {
		c.add("data.execution_id", fmt.Sprintf("is %s but the subject names %s", Quote(exec), Quote(addr.ExecutionID)))
	}
	if ValidIdentifier(team) && team != addr.TeamID {
		c.add("data.team_id", fmt.Sprintf("is %s but the subject names %s", Quote(team), Quote(addr.TeamID)))
	}
}

func (c *checker) evaluationCompleted(m map[string]any, p string) EvaluationCompleted {
	var d EvaluationCompleted
	d.ExecutionID = c.ident(m, p, "execution_id")
	d.TeamID = c.ident(m, p, "team_id")
	d.TeamName = c.nonEmpty(m, p, "team_name")
	d.RoundNumber = c.round(m, p, "round_number")
	if sub := c.object(m, p, "submission", true); sub != nil {
		sp := join(p, "submission")
		d.Submission.Content, _ = c.str(sub, sp, "content", true)
		d.Submission.Format, _ = c.str(sub, sp, "format", false)
	}
	if ev := c.object(m, p, "evaluation", true); ev != nil {
		ep := join(p, "evaluation")
		d.Evaluation.OverallScore, _ = c.number(ev, ep, "overall_score", true)
		d.Evaluation.Metrics = c.metrics(ev, ep)
		d.Evaluation.Feedback, _ = c.str(ev, ep, "feedback", false)
	}
	d.EvaluatedAt = c.timestamp(m, p, "evaluated_at")
	return d
}

func (c *checker) metrics(m map[string]any, p string) []Metric {
	items := c.array(m, p, "metrics", false)
	out := make([]Metric, 0, len(items))
	seen := make(map[string]int, len(items))
	for i, it := range items {
		ip := fmt.Sprintf("%s.metrics[%d]", p, i)
		o, ok := it.(map[string]any)
		if !ok {
			c.add(ip, "must be an object, got "+JSONKind(it))
			continue
		}
		var mt Metric
		mt.MetricName = c.nonEmpty(o, ip, "metric_name")
		if j, dup := seen[mt.MetricName]; dup && mt.MetricName != "" {
			c.add(ip+".metric_name", fmt.Sprintf("%s repeats %s.metrics[%d]; metric names must be unique", Quote(mt.MetricName), p, j))
		}
		seen[mt.MetricName] = i
		mt.Score, _ = c.number(o, ip, "score", true)
		mt.EvaluatorComment, _ = c.str(o, ip, "evaluator_comment", false)
		out = append(out, mt)
	}
	return out
}

func (c *checker) roundRequested(m map[string]any, p string) RoundRequested {
	var d RoundRequested
	d.ExecutionID = c.ident(m, p, "execution_id")
	d.TeamID = c.ident(m, p, "team_id")
	d.TeamName = c.nonEmpty(m, p, "team_name")
	d.RoundNumber = c.round(m, p, "round_number")
	d.UserPrompt = c.nonEmpty(m, p, "user_prompt")
	if v, ok := c.str(m, p, "template", false); ok {
		if !validTemplateRef(v) {
			c.add(join(p, "template"), fmt.Sprintf("%s must be name, name@<version> or name:<label> (letters, digits, '_', '-')", Quote(v)))
		}
		d.Template = v
	}
	d.Model, _ = c.str(m, p, "model", false)
	d.Timezone, _ = c.str(m, p, "timezone", false)
	if v, ok := c.integer(m, p, "max_rounds", false, 1, MaxRoundNumber); ok {
		d.MaxRounds = v
	}
	if v, ok := c.str(m, p, "score_order", false); ok {
		if so, valid := ParseScoreOrder(v); valid && v != "" {
			d.ScoreOrder = so
		} else {
			c.add(join(p, "score_order"), fmt.Sprintf("must be \"asc\" or \"desc\", got %s", Quote(v)))
		}
	}
	if v, ok := c.str(m, p, "standings", false); ok {
		if st, valid := ParseStandings(v); valid && v != "" {
			d.Standings = st
		} else {
			c.add(join(p, "standings"), fmt.Sprintf("must be \"live\" or \"before_round\", got %s", Quote(v)))
		}
	}
	if lim := c.object(m, p, "limits", false); lim != nil {
		lp := join(p, "limits")
		d.Limits.HistoryRounds = c.optInt(lim, lp, "history_rounds", 0)
		d.Limits.LeaderboardTeams = c.optInt(lim, lp, "leaderboard_teams", 0)
		d.Limits.PreviewChars = c.optInt(lim, lp, "preview_chars", 0)
		d.Limits.MaxPromptTokens = c.optInt(lim, lp, "max_prompt_tokens", 1)
	}
	d.Vars = c.object(m, p, "vars", false)
	return d
}

// validTemplateRef accepts what ParseReference reads.
func validTemplateRef(s string) bool {
	_, err := ParseReference(s)
	return err == nil
}

func (c *checker) promptComposed(m map[string]any, p string) (exec, team string) {
	if r := c.object(m, p, "request", false); r != nil {
		rp := join(p, "request")
		c.timestamp(r, rp, "time")
		if d := c.object(r, rp, "data", true); d != nil {
			c.roundRequested(d, join(rp, "data"))
		}
	}
	c.nonEmpty(m, p, "request_id")
	exec = c.ident(m, p, "execution_id")
	team = c.ident(m, p, "team_id")
	c.nonEmpty(m, p, "team_name")
	c.round(m, p, "round_number")
	c.str(m, p, "prompt", true)
	c.objects(m, p, "messages", false, func(o map[string]any, ip string) {
		c.nonEmpty(o, ip, "role")
		c.str(o, ip, "content", true)
	})
	if v, ok := c.str(m, p, "prompt_sha256", true); ok && !isHex64(v) {
		c.add(join(p, "prompt_sha256"), "must be 64 lowercase hex digits")
	}
	if t := c.object(m, p, "template", true); t != nil {
		c.templateRef(t, join(p, "template"))
	}
	if b := c.object(m, p, "builder", false); b != nil {
		bp := join(p, "builder")
		if v, ok := c.str(b, bp, "name", true); ok && !ValidIdentifier(v) {
			c.add(join(bp, "name"), "must be an identifier")
		}
		c.integer(b, bp, "version", true, 1, math.MaxInt32)
		if v, ok := c.str(b, bp, "sha256", true); ok && !isHex64(v) {
			c.add(join(bp, "sha256"), "must be 64 lowercase hex digits")
		}
		c.boolean(b, bp, "fallback", true)
		c.str(b, bp, "reason", false)
	}
	c.object(m, p, "params", false)
	c.str(m, p, "model", false)
	c.integer(m, p, "token_estimate", true, 0, math.MaxInt32)
	c.nonEmpty(m, p, "token_encoding")
	c.objects(m, p, "truncated", true, func(o map[string]any, ip string) {
		c.nonEmpty(o, ip, "section")
		c.str(o, ip, "detail", true)
	})
	if in := c.object(m, p, "inputs", true); in != nil {
		ip := join(p, "inputs")
		for i, it := range c.array(in, ip, "evaluation_ids", true) {
			if s, ok := it.(string); !ok || s == "" {
				c.add(fmt.Sprintf("%s.evaluation_ids[%d]", ip, i), "must be a non-empty string")
			}
		}
		for i, it := range c.array(in, ip, "history_rounds", true) {
			c.intValue(it, fmt.Sprintf("%s.history_rounds[%d]", ip, i), 1, MaxRoundNumber)
		}
		c.leaderboardRows(in, ip, "leaderboard")
		if v, present := in["team_position"]; present && v != nil {
			c.intValue(v, join(ip, "team_position"), 1, math.MaxInt32)
		} else if !present {
			c.add(join(ip, "team_position"), "is required (null when the team is unranked)")
		}
		c.integer(in, ip, "team_count", true, 0, math.MaxInt32)
		c.integer(in, ip, "evaluations_seq", true, 0, math.MaxInt64)
	}
	return exec, team
}

func (c *checker) promptFailed(m map[string]any, p string) (exec, team string) {
	c.nonEmpty(m, p, "request_id")
	exec = c.ident(m, p, "execution_id")
	team = c.ident(m, p, "team_id")
	c.integer(m, p, "round_number", true, 0, MaxRoundNumber) // 0 when the body was too broken to tell
	if v, ok := c.str(m, p, "code", true); ok {
		switch FailureCode(v) {
		case CodeInvalidRequest, CodeUnknownTemplate, CodeTemplateError, CodeInputsNotReady, CodeStoreUnavailable, CodeBudgetExceeded:
		default:
			c.add(join(p, "code"), fmt.Sprintf("%s is not a failure code of the contract", Quote(v)))
		}
	}
	c.nonEmpty(m, p, "message")
	c.boolean(m, p, "retryable", true)
	if t := c.object(m, p, "template", false); t != nil {
		c.templateRef(t, join(p, "template"))
	}
	return exec, team
}

// templateRef checks a TemplateRef: the template of prompt.composed, and of prompt.failed when
// the request was assigned one.
func (c *checker) templateRef(t map[string]any, tp string) {
	c.nonEmpty(t, tp, "name")
	c.integer(t, tp, "version", true, 1, math.MaxInt32)
	if v, ok := c.str(t, tp, "sha256", true); ok && !isHex64(v) {
		c.add(join(tp, "sha256"), "must be 64 lowercase hex digits")
	}
	c.str(t, tp, "variant", false)
	c.boolean(t, tp, "fallback", true)
	if v, ok := c.str(t, tp, "label", false); ok && !ValidIdentifier(v) {
		c.add(join(tp, "label"), "must be an identifier")
	}
	if v, ok := c.str(t, tp, "split", false); ok && !splitPattern.MatchString(v) {
		c.add(join(tp, "split"), fmt.Sprintf("%s must be versions and weights, as 5=50,6=50", Quote(v)))
	}
}

// splitPattern is a label's split as a record keeps it (events.TemplateRef.Split).
var splitPattern = regexp.MustCompile(`^[0-9]+=[0-9]+(,[0-9]+=[0-9]+)*$`)

func (c *checker) leaderboardUpdated(m map[string]any, p string) string {
	exec := c.ident(m, p, "execution_id")
	c.leaderboardRows(m, p, "leaderboard")
	c.integer(m, p, "evaluations_seq", true, 0, math.MaxInt64)
	return exec
}

func (c *checker) leaderboardRows(m map[string]any, p, key string) {
	for i, it := range c.array(m, p, key, true) {
		ip := fmt.Sprintf("%s[%d]", join(p, key), i)
		o, ok := it.(map[string]any)
		if !ok {
			c.add(ip, "must be an object, got "+JSONKind(it))
			continue
		}
		c.integer(o, ip, "position", true, 1, math.MaxInt32)
		c.integer(o, ip, "rank", true, 1, math.MaxInt32)
		c.ident(o, ip, "team_id")
		c.nonEmpty(o, ip, "team_name")
		c.number(o, ip, "best_score", true)
		c.round(o, ip, "best_round")
		c.integer(o, ip, "rounds", true, 1, MaxRoundNumber)
	}
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// get returns m[key]; a missing required key is reported. A null optional value counts as absent,
// as producers in languages with a None tend to send it.
func (c *checker) get(m map[string]any, p, key string, required bool) (any, bool) {
	v, ok := m[key]
	if !ok || (v == nil && !required) {
		if required {
			c.add(join(p, key), "is required")
		}
		return nil, false
	}
	return v, true
}

func (c *checker) str(m map[string]any, p, key string, required bool) (string, bool) {
	v, ok := c.get(m, p, key, required)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		c.add(join(p, key), "must be a string, got "+JSONKind(v))
	}
	return s, ok
}

func (c *checker) nonEmpty(m map[string]any, p, key string) string {
	s, ok := c.str(m, p, key, true)
	if ok && s == "" {
		c.add(join(p, key), "must not be empty")
	}
	return s
}

func (c *checker) ident(m map[string]any, p, key string) string {
	s, ok := c.str(m, p, key, true)
	if ok && !ValidIdentifier(s) {
		c.add(join(p, key), fmt.Sprintf("%s %s", Quote(s), identifierRule))
	}
	return s
}

func (c *checker) boolean(m map[string]any, p, key string, required bool) {
	if v, ok := c.get(m, p, key, required); ok {
		if _, isBool := v.(bool); !isBool {
			c.add(join(p, key), "must be a boolean, got "+JSONKind(v))
		}
	}
}

func (c *checker) number(m map[string]any, p, key string, required bool) (float64, bool) {
	v, ok := c.get(m, p, key, required)
	if !ok {
		return 0, false
	}
	n, isNum := v.(json.Number)
	if !isNum {
		c.add(join(p, key), "must be a number, got "+JSONKind(v))
		return 0, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		c.add(join(p, key), fmt.Sprintf("must be a finite number, got %s", n))
		return 0, false
	}
	return f, true
}

func (c *checker) integer(m map[string]any, p, key string, required bool, lo, hi int64) (int, bool) {
	v, ok := c.get(m, p, key, required)
	if !ok {
		return 0, false
	}
	return c.intValue(v, join(p, key), lo, hi)
}

// intValue accepts JSON numbers with no fractional part (2 and 2.0), as JSON Schema's "integer".
func (c *checker) intValue(v any, path string, lo, hi int64) (int, bool) {
	n, isNum := v.(json.Number)
	if !isNum {
		c.add(path, "must be an integer, got "+JSONKind(v))
		return 0, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		c.add(path, fmt.Sprintf("must be an integer from %d to %d, got %s", lo, hi, n))
		return 0, false
	}
	return int(f), true
}

func (c *checker) round(m map[string]any, p, key string) int {
	n, _ := c.integer(m, p, key, true, 1, MaxRoundNumber)
	return n
}

func (c *checker) optInt(m map[string]any, p, key string, lo int64) *int {
	if n, ok := c.integer(m, p, key, false, lo, math.MaxInt32); ok {
		return &n
	}
	return nil
}

func (c *checker) timestamp(m map[string]any, p, key string) time.Time {
	s, ok := c.str(m, p, key, true)
	if !ok {
		return time.Time{}
	}
	t, err := ParseTime(s)
	if err != nil {
		c.add(join(p, key), fmt.Sprintf("must be an RFC 3339 time with an offset, like 2026-11-21T10:00:00Z, got %s", Quote(s)))
	}
	return t
}

// TimePattern is the one form of a time in an event, in the schemas' "pattern" too: RFC 3339
// with an upper-case T and Z, seconds 00-59 (no leap second: Go's time cannot hold one), a point
// before fractions and an offset with a colon. Every JSON Schema validator with date-time then
// accepts what the services accept (the differential test checks it with ajv).
const TimePattern = `^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-5][0-9](\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$`

var timeForm = regexp.MustCompile(TimePattern)

// ParseTime reads a time of an event: TimePattern, a real date and time, an offset of at most
// 23:59.
func ParseTime(s string) (time.Time, error) {
	if !timeForm.MatchString(s) {
		return time.Time{}, fmt.Errorf("events: %s is not of the form 2026-11-21T10:00:00Z", Quote(s))
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, err
	}
	if _, off := t.Zone(); off <= -24*3600 || off >= 24*3600 {
		return time.Time{}, fmt.Errorf("events: offset of %s out of range", Quote(s))
	}
	return t, nil
}

// MediaTypePattern is what datacontenttype may be (in the schemas' "pattern" too):
// application/json in any case, with parameters, without surrounding spaces.
const MediaTypePattern = `^[Aa][Pp][Pp][Ll][Ii][Cc][Aa][Tt][Ii][Oo][Nn]/[Jj][Ss][Oo][Nn](\s*;.*)?$`

var mediaType = regexp.MustCompile(MediaTypePattern)

// uriReference reports whether s is made of the characters an RFC 3986 URI-reference may hold
// (unreserved, reserved, and %-escapes of two hex digits), as JSON Schema's uri-reference format
// asks: no spaces, no controls, no raw non-ASCII.
func uriReference(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9', strings.IndexByte("-._~:/?#[]@!$&'()*+,;=", b) >= 0:
		case b == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			i += 2
		default:
			return false
		}
	}
	return true
}

func isHex(b byte) bool { return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F' }

func (c *checker) object(m map[string]any, p, key string, required bool) map[string]any {
	v, ok := c.get(m, p, key, required)
	if !ok {
		return nil
	}
	o, isObj := v.(map[string]any)
	if !isObj {
		c.add(join(p, key), "must be an object, got "+JSONKind(v))
	}
	return o
}

func (c *checker) array(m map[string]any, p, key string, required bool) []any {
	v, ok := c.get(m, p, key, required)
	if !ok {
		return nil
	}
	a, isArr := v.([]any)
	if !isArr {
		c.add(join(p, key), "must be an array, got "+JSONKind(v))
	}
	return a
}

// objects checks each element of the array m[key] with each: an element that is not an object
// is an error of its own.
func (c *checker) objects(m map[string]any, p, key string, required bool, each func(o map[string]any, ip string)) {
	for i, it := range c.array(m, p, key, required) {
		ip := fmt.Sprintf("%s.%s[%d]", p, key, i)
		if o, ok := it.(map[string]any); ok {
			each(o, ip)
		} else {
			c.add(ip, "must be an object, got "+JSONKind(it))
		}
	}
}

// JSONKind names the JSON type of a decoded value ("a string", "null", ...) for error messages.
func JSONKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number, float64, float32, int, int64:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
