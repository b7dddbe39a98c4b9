package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/auditlog"
	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/internal/textdiff"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// records reads the records q selects: archived ones from ClickHouse, the tail from PROMPTS. Where
// ClickHouse cannot be opened, the stream alone is read (it holds what its retention kept).
func (e *env) records(ctx context.Context, q audit.Query) ([]audit.Record, error) {
	js, err := e.jetstream()
	if err != nil {
		return nil, err
	}
	src := audit.Source{JS: js}
	if st, err := e.rank(ctx); err == nil {
		src.Archive = st
	} else {
		fmt.Fprintf(e.stderr, "podium: the prompts archive cannot be read (%v); reading %s alone\n", err, events.StreamPrompts)
	}
	return src.Records(ctx, q)
}

// teamRound reads EXEC TEAM ROUND.
func teamRound(args []string) (string, string, int, error) {
	if len(args) != 3 {
		return "", "", 0, usagef("want EXEC TEAM ROUND, got %d arguments", len(args))
	}
	round, err := strconv.Atoi(args[2])
	if err != nil || round < 1 {
		return "", "", 0, usagef("ROUND must be a positive number, got %q", args[2])
	}
	return args[0], args[1], round, nil
}

func promptsShow(fs *flag.FlagSet) func(context.Context, *env) error {
	asJSON := fs.Bool("json", false, "print the whole record as JSON")
	return func(ctx context.Context, e *env) error {
		exec, team, round, err := teamRound(e.args)
		if err != nil {
			return err
		}
		recs, err := e.records(ctx, audit.Query{ExecutionID: exec, TeamID: team, Rounds: []int{round}})
		if err != nil {
			return err
		}
		r, ok := audit.Latest(recs, round)
		if !ok {
			return &checkError{fmt.Sprintf("no prompt.composed for %s %s round %d in %s", exec, team, round, events.StreamPrompts)}
		}
		if *asJSON {
			enc := json.NewEncoder(e.out)
			enc.SetEscapeHTML(false)
			enc.SetIndent("", "  ")
			return enc.Encode(r.Data)
		}
		d := r.Data
		fmt.Fprintf(e.out, "prompt of %s (%s) round %d, %s sequence %d%s\n", d.TeamName, d.TeamID, d.RoundNumber, events.StreamPrompts, r.Seq, archivedNote(r))
		fmt.Fprintf(e.out, "request %s; template %s@%d (sha256 %.12s…); %d tokens (%s); evaluations up to sequence %d\n",
			d.RequestID, d.Template.Name, d.Template.Version, d.Template.SHA256, d.TokenEstimate, d.TokenEncoding, d.Inputs.EvaluationsSeq)
		for _, t := range d.Truncated {
			fmt.Fprintf(e.out, "cut: %s: %s\n", t.Section, t.Detail)
		}
		if id, span, ok := audit.TraceIDs(r.TraceParent); ok {
			fmt.Fprintf(e.out, "trace %s (composed by span %s)\n", id, span)
		}
		fmt.Fprintf(e.out, "sha256 %s\n\n%s\n", d.PromptSHA256, d.Prompt)
		return nil
	}
}

func promptsVerify(fs *flag.FlagSet) func(context.Context, *env) error {
	all := fs.Bool("all", false, "verify every record of --execution")
	execution := fs.String("execution", "", "the execution of --all")
	bundle := fs.String("bundle", "", "verify every record of an export bundle (podium export), with no NATS and no ClickHouse")
	dir := fs.String("templates-dir", "", "the composers' template directory (default: COMPOSER_TEMPLATES_DIR)")
	tz := fs.String("tz", "", "the composers' default timezone (default: TZ; with --bundle, the bundle's)")
	key := fs.String("key", os.Getenv("AUDIT_PUBLIC_KEY"), "with --bundle: the audit log's public key (default $AUDIT_PUBLIC_KEY), to check each prompt's inclusion proof")
	return func(ctx context.Context, e *env) error {
		if *bundle != "" {
			if *all || *execution != "" || len(e.args) > 0 {
				return usagef("--bundle takes no other record selection")
			}
			return verifyBundle(ctx, e, *bundle, *tz, *key)
		}
		settings := e.templates.With(*dir, *tz)
		var q audit.Query
		var round int
		switch {
		case *all && *execution != "" && len(e.args) == 0:
			if !events.ValidIdentifier(*execution) {
				return usagef("--execution %s is not an identifier", events.Quote(*execution))
			}
			q.ExecutionID = *execution
		case !*all && *execution == "":
			exec, team, r, err := teamRound(e.args)
			if err != nil {
				return err
			}
			q, round = audit.Query{ExecutionID: exec, TeamID: team, Rounds: []int{r}}, r
		default:
			return usagef("verify takes EXEC TEAM ROUND, or --all --execution EXEC")
		}
		what := q.ExecutionID
		if q.TeamID != "" {
			what += " " + q.TeamID
		}
		recs, err := e.records(ctx, q)
		var changed *audit.Mismatch
		if errors.As(err, &changed) {
			return &checkError{changed.Error()} // a row changed in the archive: the verdict
		}
		if err != nil {
			return err
		}
		if round > 0 {
			r, ok := audit.Latest(recs, round)
			if !ok {
				return &checkError{fmt.Sprintf("no prompt.composed for round %d of %s", round, what)}
			}
			recs = []audit.Record{r}
		}
		if len(recs) == 0 {
			return &checkError{fmt.Sprintf("no prompt.composed of %s", what)}
		}
		view, err := e.reads(ctx)
		if err != nil {
			return err
		}
		reg, err := e.registryIfAny(ctx) // records name the version that rendered them
		if err != nil {
			return err
		}
		v := audit.NewVerifier(settings, reg, render.Store{St: view})
		if src, err := e.builderSource(ctx); err != nil {
			return err
		} else if src != nil {
			v.WithBuilders(src)
		}
		return verifyRecords(ctx, e, v, recs)
	}
}

// verifyRecords verifies each record and prints the verdicts; the first that differs is the
// command's failure.
func verifyRecords(ctx context.Context, e *env, v *audit.Verifier, recs []audit.Record) error {
	for _, r := range recs {
		if err := v.Verify(ctx, r); err != nil {
			var m *audit.Mismatch
			var bad *audit.ConfigError
			switch {
			case errors.As(err, &bad):
				return usagef("%v", bad)
			case !errors.As(err, &m):
				return err // not a verdict: the store or the templates failed
			}
			return &checkError{fmt.Sprintf("%s %s round %d (PROMPTS sequence %d%s) differs: %v", r.Data.ExecutionID, r.Data.TeamID, r.Data.RoundNumber, r.Seq, archivedNote(r), err)}
		}
		fmt.Fprintf(e.out, "ok  %s %s round %d  sha256 %.16s…  (%s@%d, evaluations up to %d)\n", r.Data.ExecutionID, r.Data.TeamID,
			r.Data.RoundNumber, r.Data.PromptSHA256, r.Data.Template.Name, r.Data.Template.Version, r.Data.Inputs.EvaluationsSeq)
	}
	fmt.Fprintf(e.out, "%d record(s) verified: every one is what its request renders as of its evaluations_seq\n", len(recs))
	return nil
}

// verifyBundle proves every record of an export bundle from the bundle alone.
func verifyBundle(ctx context.Context, e *env, path, tz, key string) error {
	f, err := os.Open(path)
	if err != nil {
		return &usageError{err.Error()}
	}
	defer f.Close()
	b, err := audit.ReadBundle(f, path, e.cfg.inputLimit())
	if err != nil {
		return &checkError{err.Error()}
	}
	recs, err := b.Records()
	if err == nil && len(recs) == 0 {
		err = fmt.Errorf("the bundle of %s holds no prompt.composed", b.ExecutionID)
	}
	if err != nil {
		return &checkError{err.Error()}
	}
	v, err := b.Verifier(tz)
	if err != nil {
		return &checkError{err.Error()}
	}
	if len(b.Builders) > 0 {
		engine, err := e.builderEngine(ctx)
		if err != nil {
			return err
		}
		v.WithBuilders(func(ctx context.Context, ref events.BuilderRef, at time.Time) (compose.Builder, error) {
			module, ok := b.Module(ref)
			if !ok {
				return nil, fmt.Errorf("the bundle does not hold its module")
			}
			return builders.FromBytes(ctx, engine, ref, module, at, e.cfg.ComposersRenderTimeout)
		})
	}
	fmt.Fprintf(e.out, "bundle of %s: %d evaluations, %d prompts, %d template versions\n", b.ExecutionID, len(b.Evaluations), len(recs), len(b.Templates))
	if err := verifyBundleLog(e, b, key); err != nil {
		return err
	}
	return verifyRecords(ctx, e, v, recs)
}

// verifyBundleLog checks the bundle's audit log proofs with the public key: the checkpoint is
// signed, and each prompt is in it as the bundle holds it. A prompt changed in the bundle is named
// with its position.
func verifyBundleLog(e *env, b audit.Bundle, key string) error {
	switch {
	case b.Log == nil && key == "":
		return nil
	case b.Log == nil:
		return &checkError{"the bundle carries no audit log proof (exported without the log's public key)"}
	case key == "":
		fmt.Fprintln(e.out, "the bundle carries a signed checkpoint and inclusion proofs: give --key (or AUDIT_PUBLIC_KEY) to check them")
		return nil
	}
	v, err := auditlog.Verifier(key)
	if err != nil {
		return usagef("%v", err)
	}
	c, err := auditlog.Open([]byte(b.Log.Checkpoint), v)
	if err != nil {
		return &checkError{fmt.Sprintf("the bundle's checkpoint: %v", err)}
	}
	// The key signs the logs of its PROMPTS streams (auditlog.Origin): a checkpoint of any other
	// log proves nothing of these records.
	if !strings.HasPrefix(c.Origin, v.Name()+"/PROMPTS/") {
		return &checkError{fmt.Sprintf("the bundle's checkpoint is of the log %s, not a PROMPTS log of key %s", events.Quote(c.Origin), v.Name())}
	}
	proofs := map[uint64][][]byte{}
	for _, p := range b.Log.Proofs {
		proofs[p.Seq] = p.Hashes
	}
	var bad []string
	proven := 0
	for _, p := range b.Prompts {
		hashes, ok := proofs[p.Seq]
		if !ok {
			// A prompt the checkpoint signs must carry its proof: one removed would hide a change.
			if pos := auditlog.Position(p.Seq); pos >= 0 && pos < c.Size {
				bad = append(bad, fmt.Sprintf("position %d (PROMPTS sequence %d): the checkpoint signs it but the bundle carries no proof of it", pos, p.Seq))
			}
			continue
		}
		proof := make(tlog.RecordProof, len(hashes))
		for i, h := range hashes {
			if len(h) != tlog.HashSize {
				bad = append(bad, fmt.Sprintf("position %d: its proof is not a list of hashes", auditlog.Position(p.Seq)))
				continue
			}
			copy(proof[i][:], h)
		}
		if err := auditlog.Included(c, p.Seq, p.Subject, []byte(p.Event), proof); err != nil {
			bad = append(bad, fmt.Sprintf("position %d (PROMPTS sequence %d): the prompt is not what the log signed: changed in the bundle (%v)", auditlog.Position(p.Seq), p.Seq, err))
			continue
		}
		proven++
	}
	fmt.Fprintf(e.out, "audit log %s: checkpoint of %d records signed; %d of %d prompts proven in it\n", c.Origin, c.Size, proven, len(b.Prompts))
	for _, line := range bad {
		fmt.Fprintln(e.out, line)
	}
	if len(bad) > 0 {
		return &checkError{fmt.Sprintf("%d prompts of the bundle are not in the signed audit log", len(bad))}
	}
	return nil
}

// archivedNote says where a record was read from, when it was the archive.
func archivedNote(r audit.Record) string {
	if r.Archived {
		return ", read from the ClickHouse archive"
	}
	return ""
}

func promptsDiff(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		exec, team, r1, err := teamRound(e.args[:3])
		if err != nil {
			return err
		}
		r2, err := strconv.Atoi(e.args[3])
		if err != nil || r2 < 1 {
			return usagef("ROUND2 must be a positive number, got %q", e.args[3])
		}
		recs, err := e.records(ctx, audit.Query{ExecutionID: exec, TeamID: team, Rounds: []int{r1, r2}})
		if err != nil {
			return err
		}
		a, okA := audit.Latest(recs, r1)
		b, okB := audit.Latest(recs, r2)
		if !okA || !okB {
			return &checkError{fmt.Sprintf("no prompt.composed of %s %s for round %d and round %d both", exec, team, r1, r2)}
		}
		textdiff.Unified(e.out, fmt.Sprintf("%s %s round %d", exec, team, r1), fmt.Sprintf("%s %s round %d", exec, team, r2), a.Data.Prompt, b.Data.Prompt, 3)
		return nil
	}
}

func promptsTail(fs *flag.FlagSet) func(context.Context, *env) error {
	execution := fs.String("execution", "*", "only this execution")
	team := fs.String("team", "*", "only this team")
	fromStart := fs.Bool("all", false, "start from the first record, not the next one")
	count := fs.Int("count", 0, "stop after this many records (0: follow until interrupted)")
	return func(ctx context.Context, e *env) error {
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		// Read by direct gets, as every reader does: a reader makes no consumer on PROMPTS.
		var after uint64
		if !*fromStart {
			if after, err = streamscan.Last(ctx, js, events.StreamPrompts); err != nil {
				return err
			}
		}
		enough := errors.New("enough records")
		seen := 0
		err = streamscan.Follow(ctx, js, events.StreamPrompts, events.PromptAnswerSubject(*execution, *team), after, time.Second, func(msg jetstream.Msg) error {
			seen++
			printTailLine(e.out, msg)
			if *count > 0 && seen >= *count {
				return enough
			}
			return nil
		})
		if errors.Is(err, enough) {
			return nil
		}
		return err // nil when interrupted: the normal end of a tail
	}
}

// printTailLine prints one record of PROMPTS as `prompts tail` shows it.
func printTailLine(out io.Writer, msg jetstream.Msg) {
	var env events.Envelope
	if err := json.Unmarshal(msg.Data(), &env); err != nil {
		fmt.Fprintf(out, "%s  (not a CloudEvent: %v)\n", msg.Subject(), err)
		return
	}
	if env.Type == events.TypePromptFailed {
		var pf events.PromptFailed
		_ = json.Unmarshal(env.Data, &pf)
		fmt.Fprintf(out, "%s  failed    %s %s round %d  %s: %s\n", env.Time, pf.ExecutionID, pf.TeamID, pf.RoundNumber, pf.Code, pf.Message)
		return
	}
	var pc events.PromptComposed
	_ = json.Unmarshal(env.Data, &pc)
	fmt.Fprintf(out, "%s  composed  %s %s round %d  %s@%d  %d tokens  sha256 %.16s…\n", env.Time, pc.ExecutionID, pc.TeamID, pc.RoundNumber,
		pc.Template.Name, pc.Template.Version, pc.TokenEstimate, pc.PromptSHA256)
}
