package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

func printJSON(e *env, v any) error {
	enc := json.NewEncoder(e.out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func leaderboard(fs *flag.FlagSet) func(context.Context, *env) error {
	asc := fs.Bool("asc", false, "lower scores are better")
	asJSON := fs.Bool("json", false, "print JSON, as the ranker's API")
	return func(ctx context.Context, e *env) error {
		if !events.ValidIdentifier(e.args[0]) {
			return usagef("want one execution id")
		}
		order := events.Desc
		if *asc {
			order = events.Asc
		}
		view, err := e.reads(ctx)
		if err != nil {
			return err
		}
		b, err := view.Leaderboard(ctx, e.args[0], order, rank.Everything())
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e, map[string]any{"execution_id": e.args[0], "teams": b.Rows, "evaluations_seq": b.Seq})
		}
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POSITION\tRANK\tTEAM\tNAME\tBEST\tBEST ROUND\tROUNDS")
		for _, r := range b.Rows {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%.2f\t%d\t%d\n", r.Position, r.Rank, r.TeamID, r.TeamName, r.BestScore, r.BestRound, r.Rounds)
		}
		fmt.Fprintf(tw, "evaluations up to sequence %d\n", b.Seq)
		return tw.Flush()
	}
}

func history(fs *flag.FlagSet) func(context.Context, *env) error {
	asJSON := fs.Bool("json", false, "print JSON, as the ranker's API")
	return func(ctx context.Context, e *env) error {
		if !events.ValidIdentifier(e.args[0]) || !events.ValidIdentifier(e.args[1]) {
			return usagef("want an execution id and a team id")
		}
		view, err := e.reads(ctx)
		if err != nil {
			return err
		}
		rounds, err := view.History(ctx, e.args[0], e.args[1], rank.Everything())
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e, map[string]any{"execution_id": e.args[0], "team_id": e.args[1], "rounds": rounds})
		}
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ROUND\tSCORE\tEVALUATION\tEVALUATED AT\tSUBMISSION")
		for _, r := range rounds {
			sub := []rune(r.Submission.Content)
			preview := string(sub[:min(len(sub), 40)])
			if len(sub) > 40 {
				preview += "…"
			}
			fmt.Fprintf(tw, "%d\t%.2f\t%s\t%s\t%s\n", r.RoundNumber, r.OverallScore, r.EvaluationID, r.EvaluatedAt, strconv.Quote(preview))
		}
		return tw.Flush()
	}
}

// publish reads an event from a file, validates it as the services will, and publishes it.
func publish(eventType string) func(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(fs *flag.FlagSet) func(context.Context, *env) error {
		file := fs.String("file", "", "the event: its data object, or a whole CloudEvent (\"-\" reads standard input)")
		id := fs.String("id", "", "the event id of a data object (default: derived from its content)")
		return func(ctx context.Context, e *env) error {
			if *file == "" {
				return usagef("want --file F")
			}
			raw, err := e.cfg.eventLimit().ReadFile(*file)
			if err != nil {
				return &usageError{err.Error()}
			}
			body, subject, evID, err := eventBody(eventType, raw, *id, e.cfg.MaxEventBytes)
			if err != nil {
				return &checkError{"not published: " + err.Error()}
			}
			js, err := e.jetstream()
			if err != nil {
				return err
			}
			ack, err := events.Publish(ctx, js, subject, evID, body)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.out, "published %s %s on %s: %s sequence %d\n", eventType, evID, subject, ack.Stream, ack.Sequence)
			return nil
		}
	}
}

// eventBody turns a data object (or a whole CloudEvent) into the body to publish and checks it
// exactly as the service that consumes it will.
func eventBody(eventType string, raw []byte, id string, maxBytes int) (body []byte, subject, evID string, err error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, "", "", fmt.Errorf("the file is not a JSON object: %w", err)
	}
	body = raw
	if _, whole := probe["specversion"]; !whole {
		var data any
		_ = json.Unmarshal(raw, &data)
		if id == "" {
			id = events.DerivedID("cli", string(raw))
		}
		if body, err = events.Marshal(id, "podium-cli", eventType, time.Now(), data); err != nil {
			return nil, "", "", err
		}
	}
	var ids struct {
		ID   string `json:"id"`
		Data struct {
			ExecutionID string `json:"execution_id"`
			TeamID      string `json:"team_id"`
		} `json:"data"`
	}
	_ = json.Unmarshal(body, &ids)
	subject = eventType + "." + ids.Data.ExecutionID + "." + ids.Data.TeamID
	if eventType == events.TypeEvaluationCompleted {
		_, err = events.ParseEvaluation(subject, body, maxBytes)
	} else {
		_, err = events.ParseRoundRequest(subject, body, maxBytes)
	}
	return body, subject, ids.ID, err
}

func deadlettersList(fs *flag.FlagSet) func(context.Context, *env) error {
	subject := fs.String("subject", "", "only dead letters of this original subject (wildcards allowed)")
	return func(ctx context.Context, e *env) error {
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		filter := "deadletter.>"
		if *subject != "" {
			filter = events.DeadLetterSubject(*subject)
		}
		msgs, err := readStream(ctx, js, events.StreamDeadLetter, filter)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tSUBJECT\tORIGINAL\tBYTES\tREASON")
		for _, m := range msgs {
			size := strconv.Itoa(len(m.Data))
			if t := m.Header.Get(events.HeaderDeadTruncated); t != "" {
				size = t + " (cut)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s %s\t%s\t%s\n", m.Sequence, m.Subject[len("deadletter."):], m.Header.Get(events.HeaderDeadStream),
				m.Header.Get(events.HeaderDeadSequence), size, m.Header.Get(events.HeaderDeadReason))
		}
		fmt.Fprintf(tw, "%d dead letter(s)\n", len(msgs))
		return tw.Flush()
	}
}

func deadlettersReplay(fs *flag.FlagSet) func(context.Context, *env) error {
	all := fs.Bool("all", false, "replay every dead letter that is valid now")
	return func(ctx context.Context, e *env) error {
		var seq uint64
		switch {
		case *all && len(e.args) == 0:
		case !*all && len(e.args) == 1:
			n, err := strconv.ParseUint(e.args[0], 10, 64)
			if err != nil || n == 0 {
				return usagef("SEQ must be a DEADLETTER sequence, got %q", e.args[0])
			}
			seq = n
		default:
			return usagef("replay takes SEQ or --all")
		}
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		msgs, err := readStream(ctx, js, events.StreamDeadLetter, "deadletter.>")
		if err != nil {
			return err
		}
		replayed, refused := 0, 0
		for _, m := range msgs {
			if seq != 0 && m.Sequence != seq {
				continue
			}
			err := replay(ctx, js, m, e.cfg.MaxEventBytes)
			if err != nil {
				refused++
				fmt.Fprintf(e.out, "refused  %d %s: %v\n", m.Sequence, m.Subject, err)
				continue
			}
			replayed++
			fmt.Fprintf(e.out, "replayed %d as %s\n", m.Sequence, m.Subject[len("deadletter."):])
		}
		if seq != 0 && replayed+refused == 0 {
			return &checkError{fmt.Sprintf("no dead letter at sequence %d", seq)}
		}
		if refused > 0 {
			return &checkError{fmt.Sprintf("%d replayed, %d refused", replayed, refused)}
		}
		fmt.Fprintf(e.out, "%d replayed\n", replayed)
		return nil
	}
}

// replay republishes the original of a dead letter, read from its own stream when the copy was
// cut, if it is valid now, under a message id of its own (the original's may still be in the
// duplicate window; the services deduplicate by event id anyway).
func replay(ctx context.Context, js jetstream.JetStream, dl *jetstream.RawStreamMsg, maxBytes int) error {
	subject := dl.Subject[len("deadletter."):]
	body := dl.Data
	if dl.Header.Get(events.HeaderDeadTruncated) != "" {
		seq, err := strconv.ParseUint(dl.Header.Get(events.HeaderDeadSequence), 10, 64)
		if err != nil {
			return fmt.Errorf("the copy was cut and names no original: %v", err)
		}
		stream, err := js.Stream(ctx, dl.Header.Get(events.HeaderDeadStream))
		if err != nil {
			return fmt.Errorf("the copy was cut and its stream is gone: %w", err)
		}
		orig, err := stream.GetMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("the copy was cut and the original is gone: %w", err)
		}
		body = orig.Data
	}
	var err error
	switch {
	case len(subject) > len(events.TypeEvaluationCompleted) && subject[:len(events.TypeEvaluationCompleted)] == events.TypeEvaluationCompleted:
		_, err = events.ParseEvaluation(subject, body, maxBytes)
	case len(subject) > len(events.TypeRoundRequested) && subject[:len(events.TypeRoundRequested)] == events.TypeRoundRequested:
		_, err = events.ParseRoundRequest(subject, body, maxBytes)
	default:
		return fmt.Errorf("%s is not an input subject", subject)
	}
	if err != nil {
		return fmt.Errorf("still invalid: %w", err)
	}
	_, err = events.Publish(ctx, js, subject, events.DerivedID("replay", dl.Header.Get(events.HeaderDeadStream), dl.Header.Get(events.HeaderDeadSequence)), body)
	return err
}

// readStream reads every message of a stream's filter, oldest first.
func readStream(ctx context.Context, js jetstream.JetStream, stream, filter string) ([]*jetstream.RawStreamMsg, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := s.CachedInfo().State.FirstSeq; seq <= s.CachedInfo().State.LastSeq && seq > 0; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if err != nil {
			break // nothing at or after seq on the filter
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
	return out, nil
}
