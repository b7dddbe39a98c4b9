package inputs

import (
	"context"
	"fmt"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// Wait implements the read-your-writes rule: every evaluation JetStream acknowledged before now
// must be committed by the ranker (its ack floor reaches the stream's last sequence S). It
// returns S, the sequence the prompt is computed as of; 0 when no evaluation was ever accepted.
// With asOf set (an audit render), S is asOf instead, which must not be past the stream's last
// sequence, and the wait is for the ranker to reach it. Past timeout it answers
// inputs_not_ready (retryable). Between probes it waits for the ranker's commit notice, or polls
// (5 ms, doubling to 100 ms) when none comes.
func (in *Inputs) Wait(ctx context.Context, asOf *uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, in.timeout)
	defer cancel()
	detail := "no answer from JetStream"
	var target uint64
	known := false
	delay := 5 * time.Millisecond
	for {
		woken := in.commits.next() // before the probe: a commit after it wakes this wait
		p, err := in.probes.join(ctx)
		if err != nil {
			break
		}
		if !known && p.streamErr == nil {
			// The first probe that read the stream started after this request was taken: the
			// stream's last sequence then is what the ranker must reach.
			target, known = p.lastSeq, true
			if asOf != nil {
				if *asOf > p.lastSeq {
					return 0, events.Failf(events.CodeInvalidRequest, "evaluations_seq %d is past the last sequence of the EVALUATIONS stream (%d)", *asOf, p.lastSeq)
				}
				target = *asOf
			}
			if target == 0 {
				return 0, nil // nothing was ever accepted (or asked for): nothing to wait for
			}
		}
		// Until the target is known the probe failed on the stream, and committed says so.
		ok, why := p.committed(target)
		if ok && known {
			return target, nil
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
		return 0, ctx.Err() // the caller went away (shutdown, a render's client): nothing to answer
	}
	return 0, &events.Failure{Code: events.CodeInputsNotReady, Retryable: true,
		Message: fmt.Sprintf("the ranker has not committed the evaluations acknowledged before this request within %s (%s)", in.timeout, detail)}
}
