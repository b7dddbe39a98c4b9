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

// A view whose table was lost while it held rows no stream holds any more waits for an operator
// (internal/sink/loss.go): the ranker's store (EVALUATIONS) or, with --archive, the prompts archive
// (PROMPTS). lost says which.
type lost struct {
	what, stream, consumer, service, key, subject, rows string
}

var (
	storeLost   = lost{"the ranker's store", events.StreamEvaluations, events.ConsumerRanker, "ranker", events.MetaStoreLoss, events.SubjectLossAccepted, "evaluations"}
	archiveLost = lost{"the prompts archive", events.StreamPrompts, events.ConsumerArchiver, "archiver", events.MetaArchiveLoss, events.SubjectArchiveLossAccepted, "prompt records"}
)

// storeAcceptLoss shows the loss the ranker (or, with --archive, the archiver) waits on
// (events.MetaStoreLoss, events.MetaArchiveLoss on its consumer) and, given the lineage it names and
// a reason, records it on AUDIT, where the service finds it and refills. Naming the lineage makes
// the operator accept the loss shown, never a later one.
func storeAcceptLoss(fs *flag.FlagSet) func(context.Context, *env) error {
	lineage := fs.String("lineage", "", "the lost lineage to accept, as shown")
	reason := fs.String("reason", "", "why the loss is accepted (recorded with it)")
	archive := fs.Bool("archive", false, "the prompts archive's loss (the archiver's), not the ranker's store's")
	asJSON := fs.Bool("json", false, "print the loss as JSON")
	return func(ctx context.Context, e *env) error {
		of := storeLost
		if *archive {
			of = archiveLost
		}
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		l, err := waitingLoss(ctx, js, of)
		if err != nil {
			return err
		}
		if l == nil {
			return &checkError{of.what + " waits on no loss"}
		}
		if *asJSON {
			if err := printJSON(e, l); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(e.out, "lineage %s lost the %s of eras %d-%d\n", l.Lineage, of.rows, l.FromEra, l.ToEra)
			if len(l.Executions) > 0 {
				fmt.Fprintf(e.out, "executions that had them: %v", l.Executions)
				if l.MoreExecutions > 0 {
					fmt.Fprintf(e.out, " and %d more (a loss names the first 100)", l.MoreExecutions)
				}
				fmt.Fprintln(e.out)
			}
		}
		if *lineage == "" {
			return &checkError{fmt.Sprintf("nothing accepted: to accept this loss, run again with --lineage %s --reason TEXT (or restore %s from a backup)", l.Lineage, of.stream)}
		}
		if *lineage != l.Lineage {
			return &checkError{fmt.Sprintf("nothing accepted: the %s waits on the loss of lineage %s, not %s", of.service, l.Lineage, *lineage)}
		}
		if *reason == "" {
			return usagef("--reason is required: it is recorded with the loss")
		}
		l.Reason = *reason
		if err := recordLoss(ctx, e, js, of, *l); err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(e.out, "accepted: recorded on %s (%s); the %s fills %s again from %s at its next check (within 5 s)\n", events.StreamAudit, of.subject, of.service, of.what, of.stream)
		}
		return nil
	}
}

// waitingLoss is the loss the service's consumer names; nil when none.
func waitingLoss(ctx context.Context, js jetstream.JetStream, of lost) (*events.StoreLoss, error) {
	cons, err := js.Consumer(ctx, of.stream, of.consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, &checkError{"the " + of.service + "'s consumer on " + of.stream + " is missing: start the " + of.service + ", which names what " + of.what + " lost"}
	}
	if err != nil {
		return nil, fmt.Errorf("the %s's consumer: %w", of.service, err)
	}
	raw := cons.CachedInfo().Config.Metadata[of.key]
	if raw == "" {
		return nil, nil
	}
	var l events.StoreLoss
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		return nil, fmt.Errorf("the loss on the %s's consumer (%s): %w", of.service, of.key, err)
	}
	return &l, nil
}

// recordLoss publishes the accepted loss on AUDIT, once per lineage (its message id).
func recordLoss(ctx context.Context, e *env, js jetstream.JetStream, of lost, l events.StoreLoss) error {
	if _, err := events.MakeStreams(ctx, js, e.cfg.Streams.Options(), events.StreamAudit); err != nil {
		return fmt.Errorf("the %s stream: %w", events.StreamAudit, err)
	}
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(of.subject)
	msg.Data = body
	return e.permitted(ctx, func(ctx context.Context) error {
		_, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(of.subject+" "+l.Lineage))
		return err
	})
}
