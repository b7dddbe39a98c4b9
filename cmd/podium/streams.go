package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/pkg/events"
)

// streamsApply is the operator's change of the streams and buckets: services make what is missing
// and never change what exists (deploy/nats/nats.conf grants them no update), so a change of
// retention, replicas or the buckets' seal is applied here, under the operator's user, after
// showing how each differs from the configuration (podium's environment: PROMPTS_MAX_AGE, ...).
func streamsApply(fs *flag.FlagSet) func(context.Context, *env) error {
	dryRun := fs.Bool("dry-run", false, "show the differences, change nothing")
	return func(ctx context.Context, e *env) error {
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		o := e.cfg.Streams.Options()
		var drifts []events.Drift
		for _, name := range events.StreamNames() {
			want, err := events.StreamConfig(name, o)
			if err != nil {
				return err
			}
			st, err := js.Stream(ctx, name)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				fmt.Fprintf(e.out, "%s: missing (its service makes it)\n", name)
				continue
			}
			if err != nil {
				return err
			}
			drifts = append(drifts, events.StreamDrift(st.CachedInfo().Config, want, o))
		}
		// ANSWERED's keys live as long as PROMPTS' records: as long as PROMPTS will keep them.
		var promptsAge time.Duration
		for _, d := range drifts {
			if d.Stream == events.StreamPrompts {
				promptsAge = d.Next.MaxAge
			}
		}
		replicas := e.cfg.StreamReplicas
		for _, cfg := range []jetstream.KeyValueConfig{registry.Config(replicas), builders.BucketConfig(replicas),
			events.ScoresBucketConfig(replicas, e.cfg.StateMaxIdle), events.AnsweredBucketConfig(replicas, promptsAge),
			events.RankerPassesBucketConfig(replicas)} {
			st, err := js.Stream(ctx, "KV_"+cfg.Bucket)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				fmt.Fprintf(e.out, "KV_%s: missing (its service makes it)\n", cfg.Bucket)
				continue
			}
			if err != nil {
				return err
			}
			drifts = append(drifts, events.BucketDrift(st.CachedInfo().Config, cfg))
		}
		// The module stores are made here when missing (as a composer makes them), and sealed:
		// whoever made one may have made it open to rollups, a republish, or limits.
		stores := []jetstream.StreamConfig{builders.ModulesConfig(replicas), builders.ReleasesConfig(replicas)}
		for _, cfg := range stores {
			st, err := js.Stream(ctx, cfg.Name)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				if *dryRun {
					fmt.Fprintf(e.out, "%s: missing (made here)\n", cfg.Name)
					continue
				}
				if _, err := builders.OpenStore(ctx, js, cfg, true); err != nil {
					return err
				}
				fmt.Fprintf(e.out, "%s: made\n", cfg.Name)
				continue
			}
			if err != nil {
				return err
			}
			d := builders.StoreDrift(st.CachedInfo().Config, cfg)
			if !d.Mendable {
				return &checkError{fmt.Sprintf("%s takes messages from other streams (a mirror or sources): it cannot be sealed; delete it and run streams apply again", cfg.Name)}
			}
			drifts = append(drifts, d.Drift)
		}
		changed := 0
		for _, d := range drifts {
			if len(d.Fields) == 0 {
				fmt.Fprintf(e.out, "%s: as configured\n", d.Stream)
				continue
			}
			fmt.Fprintf(e.out, "%s:\n", d.Stream)
			for _, f := range d.Fields {
				fmt.Fprintf(e.out, "  %s\n", f)
			}
			if *dryRun {
				continue
			}
			if _, err := js.UpdateStream(ctx, d.Next); err != nil {
				return fmt.Errorf("update %s: %w", d.Stream, err)
			}
			changed++
		}
		for i, bucket := range []string{builders.LegacyModules, builders.LegacyReleases} {
			n, err := copyLegacy(ctx, e, js, bucket, stores[i], *dryRun)
			if err != nil {
				return err
			}
			changed += n
		}
		if *dryRun {
			fmt.Fprintln(e.out, "dry run: nothing changed")
		} else {
			fmt.Fprintf(e.out, "%d stream(s) changed\n", changed)
		}
		return nil
	}
}

// copyLegacy copies into the module store of cfg what an object store of an older Podium (bucket)
// holds that it lacks, and says what it did; it reports 1 when it copied anything.
func copyLegacy(ctx context.Context, e *env, js jetstream.JetStream, bucket string, cfg jetstream.StreamConfig, dryRun bool) (int, error) {
	store, err := builders.OpenStore(ctx, js, cfg, false)
	if err != nil && !errors.Is(err, builders.ErrNoStore) {
		return 0, err
	}
	l, err := builders.FindLegacy(ctx, js, bucket, store)
	if err != nil || l.Bucket == "" {
		return 0, err
	}
	for _, name := range l.Foreign {
		fmt.Fprintf(e.out, "%s: the object store %s holds %s, not a module's sha256: not copied\n", cfg.Name, bucket, events.Quote(name))
	}
	if len(l.Missing) == 0 {
		fmt.Fprintf(e.out, "%s: holds every module of the object store %s (an older Podium's: the operator may delete it)\n", cfg.Name, bucket)
		return 0, nil
	}
	fmt.Fprintf(e.out, "%s:\n  %d module(s) of the object store %s to copy\n", cfg.Name, len(l.Missing), bucket)
	if dryRun {
		return 0, nil
	}
	if store == nil {
		if store, err = builders.OpenStore(ctx, js, cfg, true); err != nil {
			return 0, err
		}
	}
	n, err := l.Copy(ctx, store)
	fmt.Fprintf(e.out, "  %d copied\n", n)
	return 1, err
}
