package ranker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// What a lost store lost is named by the keeper (internal/sink/loss.go); the ranker's part is what
// the loss names (the executions that had rows of the lost eras, from their score snapshots and
// last boards), how the ranker says it, and where an operator's acceptance is read: AUDIT's last
// `audit.loss.evaluations` (events.SubjectLossAccepted, written by `podium store accept-loss`).

// losses is the ranker's sink.Losses.
type losses struct{ r *ranker }

func (l losses) Of(ctx context.Context, lin chstore.Lineage, stream string) (*events.StoreLoss, error) {
	return l.r.lossOf(ctx, lin, stream)
}
func (l losses) Accepted(ctx context.Context, lineage string) (bool, error) {
	return sink.AcceptedOn(ctx, l.r.nc, events.SubjectLossAccepted, lineage)
}
func (losses) Text(s events.StoreLoss) string { return lossText(s) }

// lossOf is what a lost table lost when it was derived as lin and the stream there is now is
// stream: nil when the stream holds everything the table held.
func (r *ranker) lossOf(ctx context.Context, lin chstore.Lineage, stream string) (*events.StoreLoss, error) {
	from, to, lost := lin.LostEras(stream)
	if !lost {
		return nil, nil
	}
	l := &events.StoreLoss{Lineage: lin.ID(), FromEra: from, ToEra: to, Executions: []string{}}
	// The executions are named from what was derived from the table: each execution's score
	// snapshot (SCORES) holds every stored copy with its era, and its last board (LEADERBOARDS)
	// the era of the newest evaluation it counted (an execution too large for a snapshot).
	_, err := streamscan.Scan(ctx, r.js, "KV_"+events.BucketScores, "$KV."+events.BucketScores+".>", 0, func(m jetstream.Msg) error {
		if ev, _, err := rank.ParseSnapshot(m.Data()); err == nil && ev.HoldsEras(from, to) {
			l.Executions = append(l.Executions, strings.TrimPrefix(m.Subject(), "$KV."+events.BucketScores+"."))
		}
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("name the executions lost: %w", err)
	}
	_, err = streamscan.Scan(ctx, r.js, events.StreamLeaderboards, events.TypeLeaderboardUpdated+".>", 0, func(m jetstream.Msg) error {
		var env events.Envelope
		var lu events.LeaderboardUpdated
		if json.Unmarshal(m.Data(), &env) != nil || json.Unmarshal(env.Data, &lu) != nil {
			return nil // not a board this ranker announced: nothing to name
		}
		if lu.EvaluationsEra >= from && lu.EvaluationsEra <= to && len(lu.Leaderboard) > 0 {
			l.Executions = append(l.Executions, lu.ExecutionID)
		}
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("name the executions lost: %w", err)
	}
	slices.Sort(l.Executions)
	l.Executions = slices.Compact(l.Executions)
	if n := len(l.Executions); n > events.StoreLossExecutions {
		l.Executions, l.MoreExecutions = l.Executions[:events.StoreLossExecutions], n-events.StoreLossExecutions
	}
	return l, nil
}

// lossText is a loss as the ranker names it.
func lossText(l events.StoreLoss) string {
	eras := sink.ErasText(l)
	execs := fmt.Sprint(l.Executions)
	if l.MoreExecutions > 0 {
		execs = fmt.Sprintf("%v and %d more", l.Executions, l.MoreExecutions)
	}
	return fmt.Sprintf("evaluations lost: the store (lineage %s) lost its table while it held the rows of %s, whose EVALUATIONS streams were deleted; executions that had them: %s; accept it with `podium store accept-loss --lineage %s`, or restore EVALUATIONS",
		l.Lineage, eras, execs, l.Lineage)
}
