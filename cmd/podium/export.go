package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/podium-llm/podium/internal/audit"
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
		st, err := e.reads(ctx)
		if err != nil {
			return err
		}
		evals, err := st.ExecutionRecords(ctx, *execution)
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
		return nil
	}
}
