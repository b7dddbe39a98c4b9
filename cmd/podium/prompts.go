package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// record is one prompt.composed read back from the PROMPTS audit stream.
type record struct {
	seq   uint64
	data  events.PromptComposed
	trace string // the envelope's traceparent: the composer's span that made it
}

// records reads the prompt.composed records of a subject filter from the PROMPTS stream, oldest
// first.
func records(ctx context.Context, js jetstream.JetStream, filter string) ([]record, error) {
	cons, err := js.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	var out []record
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, _ := msg.Metadata()
			var pc events.PromptComposed
			var env events.Envelope
			if err := json.Unmarshal(msg.Data(), &env); err != nil {
				return nil, fmt.Errorf("record %s: %w", msg.Subject(), err)
			}
			// Numbers as written, as the composer reads a request's vars: 0.50 stays 0.50.
			dec := json.NewDecoder(bytes.NewReader(env.Data))
			dec.UseNumber()
			if err := dec.Decode(&pc); err != nil {
				return nil, fmt.Errorf("record %s: %w", msg.Subject(), err)
			}
			out = append(out, record{seq: md.Sequence.Stream, data: pc, trace: env.TraceParent})
		}
		if n == 0 {
			break
		}
		pending -= uint64(n)
	}
	return out, nil
}

// records reads the records of a subject filter.
func (e *env) records(ctx context.Context, filter string) ([]record, error) {
	js, err := e.jetstream()
	if err != nil {
		return nil, err
	}
	return records(ctx, js, filter)
}

// traceIDs are the trace and span ids of a W3C traceparent (version-trace-span-flags).
func traceIDs(traceparent string) (trace, span string, ok bool) {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		return "", "", false
	}
	return parts[1], parts[2], true
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

// latest is the last record of a round: a request answered again keeps its first record (the
// duplicate window), so the last is the one of the latest request.
func latest(recs []record, round int) (record, bool) {
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].data.RoundNumber == round {
			return recs[i], true
		}
	}
	return record{}, false
}

func promptsShow(fs *flag.FlagSet) func(context.Context, *env) error {
	asJSON := fs.Bool("json", false, "print the whole record as JSON")
	return func(ctx context.Context, e *env) error {
		exec, team, round, err := teamRound(e.args)
		if err != nil {
			return err
		}
		recs, err := e.records(ctx, events.PromptComposedSubject(exec, team))
		if err != nil {
			return err
		}
		r, ok := latest(recs, round)
		if !ok {
			return &checkError{fmt.Sprintf("no prompt.composed for %s %s round %d in %s", exec, team, round, events.StreamPrompts)}
		}
		if *asJSON {
			enc := json.NewEncoder(e.out)
			enc.SetEscapeHTML(false)
			enc.SetIndent("", "  ")
			return enc.Encode(r.data)
		}
		d := r.data
		fmt.Fprintf(e.out, "prompt of %s (%s) round %d, %s sequence %d\n", d.TeamName, d.TeamID, d.RoundNumber, events.StreamPrompts, r.seq)
		fmt.Fprintf(e.out, "request %s; template %s@%d (sha256 %.12s…); %d tokens (%s); evaluations up to sequence %d\n",
			d.RequestID, d.Template.Name, d.Template.Version, d.Template.SHA256, d.TokenEstimate, d.TokenEncoding, d.Inputs.EvaluationsSeq)
		for _, t := range d.Truncated {
			fmt.Fprintf(e.out, "cut: %s: %s\n", t.Section, t.Detail)
		}
		if id, span, ok := traceIDs(r.trace); ok {
			fmt.Fprintf(e.out, "trace %s (composed by span %s)\n", id, span)
		}
		fmt.Fprintf(e.out, "sha256 %s\n\n%s\n", d.PromptSHA256, d.Prompt)
		return nil
	}
}

func promptsVerify(fs *flag.FlagSet) func(context.Context, *env) error {
	all := fs.Bool("all", false, "verify every record of --execution")
	execution := fs.String("execution", "", "the execution of --all")
	dir := fs.String("templates-dir", os.Getenv("COMPOSER_TEMPLATES_DIR"), "the composer's template directory")
	tz := fs.String("tz", os.Getenv("TZ"), "the composer's default timezone (TZ)")
	return func(ctx context.Context, e *env) error {
		var filter string
		var round int
		switch {
		case *all && *execution != "" && len(e.args) == 0:
			if !events.ValidIdentifier(*execution) {
				return usagef("--execution %s is not an identifier", events.Quote(*execution))
			}
			filter = events.TypePromptComposed + "." + *execution + ".*"
		case !*all && *execution == "":
			exec, team, r, err := teamRound(e.args)
			if err != nil {
				return err
			}
			filter, round = events.PromptComposedSubject(exec, team), r
		default:
			return usagef("verify takes EXEC TEAM ROUND, or --all --execution EXEC")
		}
		recs, err := e.records(ctx, filter)
		if err != nil {
			return err
		}
		if round > 0 {
			r, ok := latest(recs, round)
			if !ok {
				return &checkError{fmt.Sprintf("no prompt.composed for round %d on %s", round, filter)}
			}
			recs = []record{r}
		}
		if len(recs) == 0 {
			return &checkError{fmt.Sprintf("no prompt.composed on %s", filter)}
		}
		st, err := e.rank(ctx)
		if err != nil {
			return err
		}
		v := verifier{dir: *dir, tz: *tz, reader: render.Store{St: st}, libs: map[string]*compose.Library{}}
		// The registry's versions too, when there is one: records name the version that rendered.
		if kv, err := e.registryKV(ctx, false); err == nil {
			if v.registry, err = registryState(ctx, kv); err != nil {
				return err
			}
		}
		for _, r := range recs {
			if err := v.verify(ctx, r); err != nil {
				var m *mismatch
				if !errors.As(err, &m) {
					return err // not a verdict: the store, the templates or the arguments failed
				}
				return &checkError{fmt.Sprintf("%s %s round %d (PROMPTS sequence %d) differs: %v", r.data.ExecutionID, r.data.TeamID, r.data.RoundNumber, r.seq, err)}
			}
			fmt.Fprintf(e.out, "ok  %s %s round %d  sha256 %.16s…  (%s@%d, evaluations up to %d)\n", r.data.ExecutionID, r.data.TeamID,
				r.data.RoundNumber, r.data.PromptSHA256, r.data.Template.Name, r.data.Template.Version, r.data.Inputs.EvaluationsSeq)
		}
		fmt.Fprintf(e.out, "%d record(s) verified: every one is what its request renders as of its evaluations_seq\n", len(recs))
		return nil
	}
}

// firstDifference says where two texts part, with a little of each.
func firstDifference(rendered, recorded string) string {
	i := 0
	for i < len(rendered) && i < len(recorded) && rendered[i] == recorded[i] {
		i++
	}
	cut := func(s string) string { return strconv.Quote(strings.ToValidUTF8(s[i:min(len(s), i+40)], "")) }
	return fmt.Sprintf("the texts part at byte %d: recorded %s, rendered %s", i, cut(recorded), cut(rendered))
}

// mismatch is a record that does not render again as recorded: the verdict of verify.
type mismatch struct{ msg string }

func (m *mismatch) Error() string { return m.msg }

func differs(format string, args ...any) error { return &mismatch{fmt.Sprintf(format, args...)} }

// verifier renders records again with the composer's templates and the same reads.
type verifier struct {
	dir, tz  string
	registry registry.State
	reader   render.Reader
	libs     map[string]*compose.Library // by token encoding
}

func (v *verifier) library(encoding string) (*compose.Library, error) {
	if lib, ok := v.libs[encoding]; ok {
		return lib, nil
	}
	tokens, err := compose.NewTokenCounter(encoding)
	if err != nil {
		return nil, err
	}
	loc := time.UTC
	if tz := strings.TrimPrefix(v.tz, ":"); tz != "" {
		if loc, err = time.LoadLocation(tz); err != nil {
			return nil, usagef("--tz %s: %v", events.Quote(tz), err)
		}
	}
	lib, err := compose.Load(compose.Options{Dir: v.dir, DefaultLocation: loc, Tokens: tokens})
	if err != nil {
		return nil, usagef("templates: %v", err)
	}
	lib, _ = lib.WithRegistry(v.registry.Versions, v.registry.Labels) // bad versions rendered nothing
	v.libs[encoding] = lib
	return lib, nil
}

// verify renders one record again from its request, template version and evaluations_seq and
// compares everything it says about the prompt.
func (v *verifier) verify(ctx context.Context, r record) error {
	d := r.data
	if d.Request == nil {
		return differs("the record does not hold the request it was made from (a composer older than prompt.composed.request)")
	}
	lib, err := v.library(d.TokenEncoding)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("%s@%d", d.Template.Name, d.Template.Version) // exactly the version that rendered
	t, err := lib.Lookup(ref)
	if err != nil {
		return differs("%v", err)
	}
	if t.Version != d.Template.Version || t.SHA256 != d.Template.SHA256 {
		return differs("template %s@%d (sha256 %.12s…) is not loaded here: %s@%d (sha256 %.12s…)", d.Template.Name, d.Template.Version, d.Template.SHA256, t.Name, t.Version, t.SHA256)
	}
	at, err := time.Parse(time.RFC3339Nano, d.Request.Time)
	if err != nil {
		return differs("request time: %v", err)
	}
	req := d.Request.Data
	req.Template = ref // the version the composer resolved, whatever the request named
	in, err := render.Inputs(ctx, lib, v.reader, d.RequestID, req, at, d.Inputs.EvaluationsSeq)
	if err != nil {
		return err
	}
	out, err := lib.Compose(ctx, in)
	if err != nil {
		if _, isFailure := events.AsFailure(err); !isFailure {
			return err
		}
		return differs("renders no prompt now: %v", err)
	}
	if sum := sha256.Sum256([]byte(d.Prompt)); hex.EncodeToString(sum[:]) != d.PromptSHA256 {
		return differs("its prompt does not match its own prompt_sha256 (%.16s…): %s", d.PromptSHA256, firstDifference(out.Prompt, d.Prompt))
	}
	if out.PromptSHA256 != d.PromptSHA256 {
		return differs("prompt sha256 %.16s…, rendered again %.16s…: %s", d.PromptSHA256, out.PromptSHA256, firstDifference(out.Prompt, d.Prompt))
	}
	// Everything else the record says about the prompt, but the request, which the record names
	// by what it asked for.
	out.Request, d.Request = nil, nil
	var got, want map[string]json.RawMessage
	g, _ := json.Marshal(out)
	w, _ := json.Marshal(d)
	_ = json.Unmarshal(g, &got)
	_ = json.Unmarshal(w, &want)
	for _, field := range slices.Sorted(maps.Keys(want)) {
		if !bytes.Equal(got[field], want[field]) {
			return differs("same prompt, but %s: the record says %.200s, rendering again says %.200s", field, want[field], got[field])
		}
	}
	return nil
}

func promptsDiff(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 4 {
			return usagef("want EXEC TEAM ROUND1 ROUND2")
		}
		exec, team, r1, err := teamRound(e.args[:3])
		if err != nil {
			return err
		}
		r2, err := strconv.Atoi(e.args[3])
		if err != nil || r2 < 1 {
			return usagef("ROUND2 must be a positive number, got %q", e.args[3])
		}
		recs, err := e.records(ctx, events.PromptComposedSubject(exec, team))
		if err != nil {
			return err
		}
		a, okA := latest(recs, r1)
		b, okB := latest(recs, r2)
		if !okA || !okB {
			return &checkError{fmt.Sprintf("no prompt.composed of %s %s for round %d and round %d both", exec, team, r1, r2)}
		}
		unifiedDiff(e.out, fmt.Sprintf("%s %s round %d", exec, team, r1), fmt.Sprintf("%s %s round %d", exec, team, r2), a.data.Prompt, b.data.Prompt, 3)
		return nil
	}
}

func promptsTail(fs *flag.FlagSet) func(context.Context, *env) error {
	execution := fs.String("execution", "*", "only this execution")
	team := fs.String("team", "*", "only this team")
	fromStart := fs.Bool("all", false, "start from the first record, not the next one")
	count := fs.Int("count", 0, "stop after this many records (0: follow until interrupted)")
	return func(ctx context.Context, e *env) error {
		if len(e.args) > 0 {
			return usagef("tail takes no arguments")
		}
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		policy := jetstream.DeliverNewPolicy
		if *fromStart {
			policy = jetstream.DeliverAllPolicy
		}
		cons, err := js.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"prompt.*." + *execution + "." + *team}, DeliverPolicy: policy})
		if err != nil {
			return fmt.Errorf("read %s: %w", events.StreamPrompts, err)
		}
		for seen := 0; *count == 0 || seen < *count; {
			msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			if ctx.Err() != nil {
				return nil // interrupted: the normal end of a tail
			}
			if err != nil {
				continue // nothing new yet
			}
			seen++
			var env events.Envelope
			if err := json.Unmarshal(msg.Data(), &env); err != nil {
				fmt.Fprintf(e.out, "%s  (not a CloudEvent: %v)\n", msg.Subject(), err)
				continue
			}
			if env.Type == events.TypePromptFailed {
				var pf events.PromptFailed
				_ = json.Unmarshal(env.Data, &pf)
				fmt.Fprintf(e.out, "%s  failed    %s %s round %d  %s: %s\n", env.Time, pf.ExecutionID, pf.TeamID, pf.RoundNumber, pf.Code, pf.Message)
				continue
			}
			var pc events.PromptComposed
			_ = json.Unmarshal(env.Data, &pc)
			fmt.Fprintf(e.out, "%s  composed  %s %s round %d  %s@%d  %d tokens  sha256 %.16s…\n", env.Time, pc.ExecutionID, pc.TeamID, pc.RoundNumber,
				pc.Template.Name, pc.Template.Version, pc.TokenEstimate, pc.PromptSHA256)
		}
		return nil
	}
}
