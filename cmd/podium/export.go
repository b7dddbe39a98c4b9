package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/auditlog"
	"github.com/podium-llm/podium/pkg/events"
)

// export writes one execution's bundle (audit.Bundle): its evaluations from the store, its
// records from the archive and the stream's tail, and the files of every template version they
// name, so that `podium prompts verify --bundle` proves it on a machine with no servers.
func export(fs *flag.FlagSet) func(context.Context, *env) error {
	execution := fs.String("execution", "", "the execution to export")
	out := fs.String("out", "", "the bundle file (gzip-compressed when it ends in .gz); default EXEC.podium.json.gz")
	dir := fs.String("templates-dir", "", "the composers' template directory, where templates the records name may live (default: COMPOSER_TEMPLATES_DIR)")
	tz := fs.String("tz", "", "the composers' default timezone, recorded in the bundle (default: TZ)")
	key := fs.String("key", os.Getenv("AUDIT_PUBLIC_KEY"), "the audit log's public key (default $AUDIT_PUBLIC_KEY): the bundle carries the latest checkpoint and each prompt's inclusion proof")
	return func(ctx context.Context, e *env) error {
		if *execution == "" {
			return usagef("export takes --execution EXEC")
		}
		if !events.ValidIdentifier(*execution) {
			return usagef("--execution %s is not an identifier", events.Quote(*execution))
		}
		path := *out
		if path == "" {
			path = *execution + ".podium.json.gz"
		}
		view, err := e.reads(ctx)
		if err != nil {
			return err
		}
		evals, err := view.ExecutionRecords(ctx, *execution)
		if err != nil {
			return err
		}
		recs, err := e.records(ctx, audit.Query{ExecutionID: *execution})
		if err != nil {
			return err
		}
		if len(recs) == 0 && len(evals) == 0 {
			return &checkError{fmt.Sprintf("execution %s has no evaluations and no prompts", *execution)}
		}
		reg, err := e.registryIfAny(ctx) // records name the version that rendered them
		if err != nil {
			return err
		}
		encoding := "" // the settings' own
		if len(recs) > 0 {
			encoding = recs[0].Data.TokenEncoding
		}
		settings := e.templates.With(*dir, *tz)
		lib, err := settings.Load(encoding, reg)
		if err != nil {
			return usagef("%v", err)
		}
		modules, err := e.builderModules(ctx)
		if err != nil {
			return err
		}
		b, err := audit.NewBundle(*execution, settings.TZ, evals, recs, lib, modules)
		if err != nil {
			return &checkError{err.Error()}
		}
		unsigned := 0
		if *key != "" {
			if unsigned, err = e.proveBundle(ctx, &b, *key); err != nil {
				return err
			}
		}
		var buf bytes.Buffer
		if err := b.Write(&buf, strings.HasSuffix(path, ".gz")); err != nil {
			return err
		}
		// A refill that touched the store while it was read would make a short bundle: none is
		// written then.
		if err := e.view.End(ctx); err != nil {
			return fmt.Errorf("%w (no bundle written)", err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			return &usageError{err.Error()}
		}
		fmt.Fprintf(e.out, "%s: %d evaluations, %d prompts, %d template versions, %d builder versions of %s (%d bytes); verify it anywhere with `podium prompts verify --bundle %s`\n",
			path, len(b.Evaluations), len(b.Prompts), len(b.Templates), len(b.Builders), *execution, buf.Len(), path)
		if b.Log != nil {
			fmt.Fprintf(e.out, "%d prompts proven in the signed audit log (add --key to the verify to check the proofs)", len(b.Prompts)-unsigned)
			if unsigned > 0 {
				fmt.Fprintf(e.out, "; %d not signed yet (the next checkpoint comes within ARCHIVER_AUDIT_CHECKPOINT_INTERVAL): export again to prove them", unsigned)
			}
			fmt.Fprintln(e.out)
		}
		return nil
	}
}

// proveBundle adds to b the audit log's latest checkpoint and each prompt's inclusion proof in it
// (docs/audit.md). The log is checked whole first: no proof is made from a log that is not. It
// returns how many prompts the checkpoint does not sign (recorded after it, or of a PROMPTS
// deleted since).
func (e *env) proveBundle(ctx context.Context, b *audit.Bundle, public string) (int, error) {
	v, err := auditlog.Verifier(public)
	if err != nil {
		return 0, usagef("%v", err)
	}
	rep, err := e.checkAuditLog(ctx, v, nil, false) // its proofs are of the current log
	if err != nil {
		return 0, err
	}
	if !rep.Whole() {
		return 0, &checkError{fmt.Sprintf("the audit log is not whole (%d findings: podium audit check names them); no proof is made from it: export without --key for a bundle without proofs", len(rep.Findings))}
	}
	if rep.Latest == nil {
		return 0, &checkError{"the audit log has no checkpoint yet (is ARCHIVER_AUDIT_SIGNING_KEY_FILE set?): export without --key for a bundle without proofs"}
	}
	log := &audit.BundleLog{Checkpoint: string(rep.Latest.Signed), Proofs: []audit.BundleProof{}}
	unsigned := 0
	for _, p := range b.Prompts {
		pos := auditlog.Position(p.Seq)
		if pos < 0 || pos >= rep.Latest.Size {
			unsigned++
			continue
		}
		proof, err := rep.Tree.Inclusion(pos, rep.Latest.Size)
		if err != nil {
			return 0, err
		}
		// A record of a PROMPTS deleted since has a sequence of another log: its proof fails.
		if auditlog.Included(*rep.Latest, p.Seq, p.Subject, []byte(p.Event), proof) != nil {
			unsigned++
			continue
		}
		hashes := make([][]byte, len(proof))
		for i := range proof {
			hashes[i] = proof[i][:]
		}
		log.Proofs = append(log.Proofs, audit.BundleProof{Seq: p.Seq, Hashes: hashes})
	}
	b.Log = log
	return unsigned, nil
}
