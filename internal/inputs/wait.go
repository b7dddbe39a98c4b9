package inputs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Wait implements the read-your-writes rule: every evaluation JetStream acknowledged before now
// must be committed by the ranker (its ack floor reaches the stream's last sequence S). It
// returns the position the prompt is computed as of: S, in the era of the stream the probe read
// (eraOf), so the evaluations of a stream deleted since (earlier eras) all count. With asOf set
// (an audit render), the position is asOf instead, which must not be past the stream's last
// sequence, and the wait is for the ranker to reach it. Past timeout it answers inputs_not_ready
// (retryable): a missing EVALUATIONS stream, or one the ranker has not taken up yet, is waited
// for, never read as "nothing was accepted". Between probes it waits for the ranker's commit
// notice, or polls (5 ms, doubling to 100 ms) when none comes.
func (in *Inputs) Wait(ctx context.Context, asOf *rank.Pos) (rank.Pos, error) {
	ctx, cancel := context.WithTimeout(ctx, in.timeout)
	defer cancel()
	detail := "no answer from JetStream"
	var target uint64
	var targetStream string // the stream target is a sequence of
	known := false
	delay := 5 * time.Millisecond
	for {
		woken := in.commits.next() // before the probe: a commit after it wakes this wait
		p, err := in.probes.join(ctx)
		if err != nil {
			break
		}
		var why string
		switch {
		case p.noStream:
			why = "the EVALUATIONS stream does not exist (deleted, or not made yet): the ranker makes it again"
		case p.streamErr != nil:
			why = "EVALUATIONS stream: " + p.streamErr.Error()
		default:
			if !known || p.stream != targetStream {
				// The first probe that read the stream started after this request was taken: the
				// stream's last sequence then is what the ranker must reach. A stream made again
				// since is a new era: what the one before held counts whole, and the new one's
				// last sequence is the target.
				target, targetStream, known = p.lastSeq, p.stream, true
			}
			pos, whyNot, err := in.settle(ctx, p, target, asOf)
			if err != nil || whyNot == "" {
				return pos, err
			}
			why = whyNot
		}
		detail = why
		select {
		case <-ctx.Done():
		case <-woken:
		case <-in.clock.After(delay):
		}
		if ctx.Err() != nil {
			break
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
	if ctx.Err() == context.Canceled {
		return rank.Pos{}, ctx.Err() // the caller went away (shutdown, a render's client): nothing to answer
	}
	return rank.Pos{}, &events.Failure{Code: events.CodeInputsNotReady, Retryable: true,
		Message: fmt.Sprintf("the ranker has not committed the evaluations acknowledged before this request within %s (%s)", in.timeout, detail)}
}

// settle says, of one probe, as of which position the request may be composed now; else why not
// (for inputs_not_ready), or the error that fails the request at once.
func (in *Inputs) settle(ctx context.Context, p *probe, target uint64, asOf *rank.Pos) (rank.Pos, string, error) {
	if asOf == nil {
		// The ack floor first: what an operator most often needs to hear of (the ranker away).
		if target > 0 {
			if ok, why := p.committed(target); !ok {
				return rank.Pos{}, why, nil
			}
		}
		era, why := in.eraOf(ctx, p)
		return rank.Pos{Era: era, Seq: target}, why, nil
	}
	era, why := in.eraOf(ctx, p)
	switch {
	case why != "":
		return rank.Pos{}, why, nil
	case asOf.Era > era:
		return rank.Pos{}, "", events.Failf(events.CodeInvalidRequest, "evaluations_era %d is past the era of the EVALUATIONS stream (%d)", asOf.Era, era)
	case asOf.Era == era && asOf.Seq > p.lastSeq:
		return rank.Pos{}, "", events.Failf(events.CodeInvalidRequest, "evaluations_seq %d is past the last sequence of the EVALUATIONS stream (%d)", asOf.Seq, p.lastSeq)
	case asOf.Era < era:
		return *asOf, "", nil // a deleted stream's: the store holds all it will ever hold of it
	}
	if asOf.Seq > 0 {
		if ok, why := p.committed(asOf.Seq); !ok {
			return rank.Pos{}, why, nil
		}
	}
	return *asOf, "", nil
}

// eraOf is the era of the stream the probe read (rank.Pos): the one the ranker published with
// the store's lineage on its consumer, once that lineage names this stream. A lineage of another
// stream is the ranker not having taken up a stream made again yet: then nothing of the new
// stream is in the store under its era, and the request waits. Where the ranker published no
// lineage (it has not checked its store yet, or is of a Podium before lineages), the store's own
// lineage says; a store with none was never derived from any stream: era 0.
func (in *Inputs) eraOf(ctx context.Context, p *probe) (uint32, string) {
	if p.lineage != "" {
		if _, stream, _ := strings.Cut(p.lineage, "@"); stream != p.stream {
			return 0, "the ranker has not taken up the EVALUATIONS stream made again yet (its store's lineage names another stream)"
		}
		if p.eraErr != nil {
			return 0, "the ranker's consumer names no era: " + p.eraErr.Error()
		}
		return p.era, ""
	}
	if in.storeLineage == nil {
		return 0, ""
	}
	lin, found, err := in.storeLineage(ctx)
	switch {
	case chstore.FaultOf(err) == chstore.Missing:
		return 0, "" // no store yet: never derived from any stream
	case err != nil:
		return 0, "the store's lineage: " + err.Error()
	case !found:
		return 0, ""
	case lin.Stream != p.stream:
		return 0, "the store was derived from another EVALUATIONS stream than this one, and the ranker has not taken it up yet"
	}
	return lin.Era, ""
}
