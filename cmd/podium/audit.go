package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/mod/sumdb/note"

	"github.com/podium-llm/podium/internal/archiver"
	"github.com/podium-llm/podium/internal/auditlog"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
)

// auditKeygen makes the audit log's signing key: the private key into a file only the archiver
// reads, the public key printed (all an auditor needs).
func auditKeygen(fs *flag.FlagSet) func(context.Context, *env) error {
	out := fs.String("out", "audit-signing.key", "file to write the private key to (made, never overwritten; mode 0600)")
	return func(ctx context.Context, e *env) error {
		name := fs.Arg(0)
		if !events.ValidIdentifier(name) {
			return usagef("the log's name %s: an identifier (1-128 characters of A-Z, a-z, 0-9, '_' and '-')", events.Quote(name))
		}
		private, public, err := auditlog.NewKey(name)
		if err != nil {
			return err
		}
		f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("write the private key: %w", err)
		}
		if _, err := fmt.Fprintln(f, private); err != nil {
			f.Close()
			return fmt.Errorf("write the private key: %w", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("write the private key: %w", err)
		}
		abs, _ := filepath.Abs(*out)
		fmt.Fprintf(e.out, "private key: %s (the archiver's ARCHIVER_AUDIT_SIGNING_KEY_FILE; keep it secret)\npublic key:  %s\n", abs, public)
		fmt.Fprintln(e.out, "Give auditors the public key (AUDIT_PUBLIC_KEY or --key): the log is named by it.")
		return nil
	}
}

// auditCheck checks the audit log over PROMPTS: every checkpoint signed, the log only grown, the
// stream and the archive holding exactly what the signed tree holds.
func auditCheck(fs *flag.FlagSet) func(context.Context, *env) error {
	key := fs.String("key", os.Getenv("AUDIT_PUBLIC_KEY"), "the log's public key (default $AUDIT_PUBLIC_KEY)")
	since := fs.String("since", "", "a checkpoint kept from an earlier check (a file): prove the log only grew since it")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	return func(ctx context.Context, e *env) error {
		if *key == "" {
			return usagef("audit check needs the log's public key: --key or AUDIT_PUBLIC_KEY")
		}
		v, err := auditlog.Verifier(*key)
		if err != nil {
			return usagef("%v", err)
		}
		var sinceNote []byte
		if *since != "" {
			if sinceNote, err = os.ReadFile(*since); err != nil {
				return usagef("--since: %v", err)
			}
		}
		rep, err := e.checkAuditLog(ctx, v, sinceNote, true)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(e.out)
			enc.SetIndent("", "  ")
			if err := enc.Encode(rep); err != nil {
				return err
			}
		} else {
			printAuditReport(e, rep)
		}
		if !rep.EveryLogWhole() {
			n := len(rep.Findings)
			for _, o := range rep.Older {
				n += len(o.Findings)
			}
			return &checkError{fmt.Sprintf("the audit log is not whole: %d findings", n)}
		}
		return nil
	}
}

// checkAuditLog reads AUDIT, PROMPTS and the archive and checks them (auditlog.Check); with older,
// the key's logs of PROMPTS streams deleted since too.
func (e *env) checkAuditLog(ctx context.Context, v note.Verifier, since []byte, older bool) (auditlog.Report, error) {
	js, err := e.jetstream()
	if err != nil {
		return auditlog.Report{}, err
	}
	prompts, err := js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return auditlog.Report{}, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	info := prompts.CachedInfo()
	// The log's name is its key's: the archiver signs with the key `podium audit keygen NAME` made.
	origin := auditlog.Origin(v.Name(), info.Created)
	var floor uint64 // no archiver yet: nothing is below its ack floor
	c, err := js.Consumer(ctx, events.StreamPrompts, events.ConsumerArchiver)
	switch {
	case err == nil:
		floor = c.CachedInfo().AckFloor.Stream
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return auditlog.Report{}, fmt.Errorf("read the archiver's ack floor: %w", err)
	}
	st, err := e.rank(ctx)
	if err != nil {
		return auditlog.Report{}, err
	}
	created := info.Created.UTC()
	src := auditlog.Sources{
		Checkpoints: func(yield func(uint64, []byte) error) error {
			_, err := streamscan.Scan(ctx, js, events.StreamAudit, auditlog.Subject, 0, func(m jetstream.Msg) error {
				md, err := m.Metadata()
				if err != nil {
					return err
				}
				return yield(md.Sequence.Stream, m.Data())
			})
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil // no checkpoint yet: the archiver keeps no log
			}
			return err
		},
		Stream: func(yield func(uint64, string, []byte) error) error {
			_, err := streamscan.Scan(ctx, js, events.StreamPrompts, ">", 0, func(m jetstream.Msg) error {
				md, err := m.Metadata()
				if err != nil {
					return err
				}
				return yield(md.Sequence.Stream, m.Subject(), m.Data())
			})
			return err
		},
		First: info.State.FirstSeq, Last: info.State.LastSeq,
		LastNow: func() (uint64, error) { return streamscan.Last(ctx, js, events.StreamPrompts) },
		Archive: func(yield func(uint64, string, []byte, string) error) error {
			return st.ArchiveRowsOf(ctx, created, yield)
		},
		AckFloor: floor,
		IsRecord: isRecord,
	}
	rep, err := auditlog.Check(v, origin, since, src)
	if err != nil || !older {
		return rep, err
	}
	// Checked as well: the key's logs of the PROMPTS streams deleted before; what is left
	// unchecked is another key's.
	rep.Older, rep.Others, err = e.checkOlderLogs(ctx, v, src.Checkpoints, origin, created)
	return rep, err
}

// isRecord is the archiver's own test of a record: what it keeps, and what it dead-letters.
func isRecord(_ string, body []byte) bool { return archiver.IsRecord(body) }

// checkOlderLogs checks the key's logs of the PROMPTS streams deleted before the one created at
// current, oldest first (auditlog.CheckOlder): each has the archive's rows of its stream, and
// those its stream delivered after it was deleted (the archiver names them "deleted before" the
// stream it found then), up to the creation of the next stream known: one any log names, or any
// row of the archive (a stream between two of this key's logs with no log of its own keeps its
// rows out of both). unchecked counts the checkpoints of any other log (another key's).
func (e *env) checkOlderLogs(ctx context.Context, v note.Verifier, checkpoints func(func(uint64, []byte) error) error, currentOrigin string, current time.Time) (reports []auditlog.Report, unchecked int, err error) {
	prefix := v.Name() + "/PROMPTS/"
	logs := map[time.Time]string{}
	streams := []time.Time{current} // every PROMPTS known to have been created
	err = checkpoints(func(_ uint64, signed []byte) error {
		origin, _, _ := strings.Cut(string(signed), "\n")
		_, stream, named := strings.Cut(origin, "/PROMPTS/")
		created, err := time.Parse(time.RFC3339Nano, stream)
		if named && err == nil {
			streams = append(streams, created)
		}
		switch {
		case origin == currentOrigin:
		case err == nil && strings.HasPrefix(origin, prefix) && created.Before(current):
			logs[created] = origin
		default:
			unchecked++
		}
		return nil
	})
	if err != nil || len(logs) == 0 {
		return nil, unchecked, err
	}
	st, err := e.rank(ctx)
	if err != nil {
		return nil, unchecked, err
	}
	named, err := st.ArchiveStreams(ctx)
	if err != nil {
		return nil, unchecked, err
	}
	for _, n := range named {
		if created, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(n, "deleted before ")); err == nil {
			streams = append(streams, created)
		}
	}
	slices.SortFunc(streams, func(a, b time.Time) int { return a.Compare(b) })
	for _, created := range slices.SortedFunc(maps.Keys(logs), func(a, b time.Time) int { return a.Compare(b) }) {
		next := streams[slices.IndexFunc(streams, func(t time.Time) bool { return t.After(created) })] // current at the latest
		rows := func(yield func(uint64, string, []byte, string) error) error {
			if err := st.ArchiveRowsOf(ctx, created, yield); err != nil {
				return err
			}
			return st.ArchiveRowsDeletedBefore(ctx, func(before string, seq uint64, subject string, body []byte, id string) error {
				if at, err := time.Parse(time.RFC3339Nano, before); err == nil && at.Equal(next) {
					return yield(seq, subject, body, id)
				}
				return nil
			})
		}
		rep, err := auditlog.CheckOlder(v, logs[created], checkpoints, rows, isRecord)
		if err != nil {
			return nil, unchecked, fmt.Errorf("the log %s: %w", logs[created], err)
		}
		reports = append(reports, rep)
	}
	return reports, unchecked, nil
}

func printAuditReport(e *env, rep auditlog.Report) {
	for _, o := range rep.Older {
		fmt.Fprintf(e.out, "log %s (a PROMPTS deleted since: its records in the archive alone)\n", o.Origin)
		fmt.Fprintf(e.out, "the archive %d rows; %d signed checkpoints, the latest of %d records; %d consistency proofs checked\n", o.ArchiveRows, o.Checkpoints, o.Signed, o.Consistent)
		printFindings(e, o)
		if o.Whole() {
			fmt.Fprintln(e.out, "the log is whole: the archive holds exactly what its signed tree holds")
		}
		fmt.Fprintln(e.out)
	}
	fmt.Fprintf(e.out, "log %s\n", rep.Origin)
	fmt.Fprintf(e.out, "PROMPTS holds %d records, the archive %d rows; %d signed checkpoints, the latest of %d records; %d consistency proofs checked\n",
		rep.StreamRecords, rep.ArchiveRows, rep.Checkpoints, rep.Signed, rep.Consistent)
	if rep.Others > 0 {
		fmt.Fprintf(e.out, "%d checkpoints of other logs (another key's, before a rotation) are not checked here\n", rep.Others)
	}
	if rep.SinceConsistent {
		fmt.Fprintln(e.out, "the log only grew since the checkpoint given with --since")
	}
	printFindings(e, rep)
	if rep.Whole() {
		fmt.Fprintln(e.out, "the log is whole: every checkpoint is signed, and PROMPTS and the archive hold exactly what the signed tree holds")
		if rep.Latest != nil {
			fmt.Fprintf(e.out, "\nthe latest checkpoint (keep it; pass it as --since next time):\n%s", rep.Latest.Signed)
		}
	}
}

// printFindings prints each of a log's findings, with its position.
func printFindings(e *env, rep auditlog.Report) {
	for _, f := range rep.Findings {
		if f.Position >= 0 {
			fmt.Fprintf(e.out, "position %d: %s\n", f.Position, f.What)
		} else {
			fmt.Fprintf(e.out, "%s\n", f.What)
		}
	}
}
