package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"

	"github.com/podium-llm/podium/internal/chstore"
)

// storeStatus says which ClickHouse replicas answer and how far each is behind: the highest
// EVALUATIONS sequence it holds against the highest any holds, and its replication queue.
func storeStatus(fs *flag.FlagSet) func(context.Context, *env) error {
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, e *env) error {
		st, err := e.rank(ctx)
		if err != nil {
			return err
		}
		reps := st.Status(ctx)
		var top uint64
		down := 0
		for _, r := range reps {
			if r.Err != nil {
				down++
				continue
			}
			top = max(top, r.MaxSeq)
		}
		if *asJSON {
			if err := printJSON(e, statusJSON(reps, top)); err != nil {
				return err
			}
		} else {
			printStatus(e, reps, top)
		}
		if down > 0 {
			return &checkError{fmt.Sprintf("%d of %d ClickHouse replicas do not answer", down, len(reps))}
		}
		return nil
	}
}

func printStatus(e *env, reps []chstore.ReplicaStatus, top uint64) {
	tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tANSWERS\tROWS\tMAX SEQ\tBEHIND\tQUEUE\tFETCHES\tLOG LAG\tDELAY\tREPLICAS\tREAD-ONLY")
	for _, r := range reps {
		if r.Err != nil {
			fmt.Fprintf(tw, "%s\tno: %s\n", r.Addr, r.Err.Error())
			continue
		}
		if !r.Replicated {
			fmt.Fprintf(tw, "%s\tyes\t%d\t%d\t%d\t-\t-\t-\t-\tnot replicated\t-\n", r.Addr, r.Rows, r.MaxSeq, top-r.MaxSeq)
			continue
		}
		fmt.Fprintf(tw, "%s\tyes\t%d\t%d\t%d\t%d\t%d\t%d\t%ds\t%d/%d active\t%v\n", r.Addr, r.Rows, r.MaxSeq, top-r.MaxSeq,
			r.QueueSize, r.InsertsInQueue, r.LogLag, r.AbsoluteDelay, r.ActiveReplicas, r.TotalReplicas, r.ReadOnly)
	}
	tw.Flush()
	fmt.Fprintln(e.out, "BEHIND: sequences below the highest any replica holds; FETCHES: parts written elsewhere, not fetched yet")
}

func statusJSON(reps []chstore.ReplicaStatus, top uint64) []map[string]any {
	out := make([]map[string]any, 0, len(reps))
	for _, r := range reps {
		m := map[string]any{"replica": r.Addr, "answers": r.Err == nil}
		if r.Err != nil {
			m["error"] = r.Err.Error()
		} else {
			m["rows"], m["max_seq"], m["behind"], m["replicated"] = r.Rows, r.MaxSeq, top-r.MaxSeq, r.Replicated
			if r.Replicated {
				m["queue_size"], m["inserts_in_queue"], m["log_lag"], m["absolute_delay_seconds"] = r.QueueSize, r.InsertsInQueue, r.LogLag, r.AbsoluteDelay
				m["active_replicas"], m["total_replicas"], m["read_only"] = r.ActiveReplicas, r.TotalReplicas, r.ReadOnly
			}
		}
		out = append(out, m)
	}
	return out
}
