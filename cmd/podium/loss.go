package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// storeAcceptLoss shows the loss the ranker waits on (events.MetaStoreLoss on its consumer) and,
// given the lineage it names and a reason, records it on AUDIT, where the ranker finds it and
// refills (internal/ranker/loss.go). Naming the lineage makes the operator accept the loss shown,
// never a later one.
func storeAcceptLoss(fs *flag.FlagSet) func(context.Context, *env) error {
	lineage := fs.String("lineage", "", "the lost lineage to accept, as shown")
	reason := fs.String("reason", "", "why the loss is accepted (recorded with it)")
	asJSON := fs.Bool("json", false, "print the loss as JSON")
	return func(ctx context.Context, e *env) error {
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		l, err := waitingLoss(ctx, js)
		if err != nil {
			return err
		}
		if l == nil {
			return &checkError{"the ranker's store waits on no loss"}
		}
		if *asJSON {
			if err := printJSON(e, l); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(e.out, "lineage %s lost the evaluations of eras %d-%d\nexecutions that had them: %v", l.Lineage, l.FromEra, l.ToEra, l.Executions)
			if l.MoreExecutions > 0 {
				fmt.Fprintf(e.out, " and %d more (a loss names the first 100)", l.MoreExecutions)
			}
			fmt.Fprintln(e.out)
		}
		if *lineage == "" {
			return &checkError{fmt.Sprintf("nothing accepted: to accept this loss, run again with --lineage %s --reason TEXT (or restore EVALUATIONS from a backup)", l.Lineage)}
		}
		if *lineage != l.Lineage {
			return &checkError{fmt.Sprintf("nothing accepted: the ranker waits on the loss of lineage %s, not %s", l.Lineage, *lineage)}
		}
		if *reason == "" {
			return usagef("--reason is required: it is recorded with the loss")
		}
		l.Reason = *reason
		if err := recordLoss(ctx, e, js, *l); err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(e.out, "accepted: recorded on %s (%s); the ranker refills its store from EVALUATIONS at its next check (within 5 s)\n", events.StreamAudit, events.SubjectLossAccepted)
		}
		return nil
	}
}

// waitingLoss is the loss the ranker's consumer names; nil when none.
func waitingLoss(ctx context.Context, js jetstream.JetStream) (*events.StoreLoss, error) {
	cons, err := js.Consumer(ctx, events.StreamEvaluations, events.ConsumerRanker)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, &checkError{"the ranker's consumer on " + events.StreamEvaluations + " is missing: start the ranker, which names what its store lost"}
	}
	if err != nil {
		return nil, fmt.Errorf("the ranker's consumer: %w", err)
	}
	raw := cons.CachedInfo().Config.Metadata[events.MetaStoreLoss]
	if raw == "" {
		return nil, nil
	}
	var l events.StoreLoss
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		return nil, fmt.Errorf("the loss on the ranker's consumer (%s): %w", events.MetaStoreLoss, err)
	}
	return &l, nil
}

// recordLoss publishes the accepted loss on AUDIT, once per lineage (its message id).
func recordLoss(ctx context.Context, e *env, js jetstream.JetStream, l events.StoreLoss) error {
	if _, err := events.MakeStreams(ctx, js, e.cfg.Streams.Options(), events.StreamAudit); err != nil {
		return fmt.Errorf("the %s stream: %w", events.StreamAudit, err)
	}
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(events.SubjectLossAccepted)
	msg.Data = body
	return e.permitted(ctx, func(ctx context.Context) error {
		_, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID("loss "+l.Lineage))
		return err
	})
}
