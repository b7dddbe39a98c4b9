package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/auditlog"
	"github.com/podium-llm/podium/internal/bounded"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// auditKey makes the log's key with `podium audit keygen`, as an operator does: the private key's
// file, and the public key it prints.
func (e *env) auditKey(t *testing.T, name string) (keyFile, public string) {
	t.Helper()
	keyFile = filepath.Join(t.TempDir(), "audit.key")
	out, code := e.podium(t, nil, "audit", "keygen", name, "--out", keyFile)
	if code != 0 {
		t.Fatalf("audit keygen: exit %d\n%s", code, out)
	}
	m := regexp.MustCompile(`public key:\s+(\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("audit keygen printed no public key:\n%s", out)
	}
	if out, code := e.podium(t, nil, "audit", "keygen", name, "--out", keyFile); code == 0 {
		t.Fatalf("audit keygen overwrote a key:\n%s", out)
	}
	return keyFile, m[1]
}

// keeping is the archiver's settings to keep the audit log with keyFile, checkpoints every 4
// records or 200 ms.
func keeping(keyFile string) []string {
	return []string{"ARCHIVER_AUDIT_SIGNING_KEY_FILE=" + keyFile, "ARCHIVER_AUDIT_CHECKPOINT_EVERY=4", "ARCHIVER_AUDIT_CHECKPOINT_INTERVAL=200ms"}
}

// auditCheck runs `podium audit check` with the log's public key.
func (e *env) auditCheck(t *testing.T, public string, args ...string) (string, int) {
	t.Helper()
	return e.podium(t, []string{"AUDIT_PUBLIC_KEY=" + public}, append([]string{"audit", "check"}, args...)...)
}

// signedUpTo waits until AUDIT's latest checkpoint is of the log of PROMPTS as it is now and signs
// every message it holds, and returns it, read with js.
func signedUpTo(t *testing.T, js jetstream.JetStream, public string) auditlog.Checkpoint {
	t.Helper()
	v, err := auditlog.Verifier(public)
	if err != nil {
		t.Fatal(err)
	}
	var c auditlog.Checkpoint
	testenv.WaitFor(t, 30*time.Second, "a checkpoint of every record of PROMPTS", func() (bool, string) {
		prompts, err := js.Stream(t.Context(), events.StreamPrompts)
		if err != nil {
			return false, err.Error()
		}
		audit, err := js.Stream(t.Context(), events.StreamAudit)
		if err != nil {
			return false, err.Error()
		}
		last, err := audit.GetLastMsgForSubject(t.Context(), auditlog.Subject)
		if err != nil {
			return false, err.Error()
		}
		if c, err = auditlog.Open(last.Data, v); err != nil {
			return false, err.Error()
		}
		want, origin := int64(prompts.CachedInfo().State.LastSeq), auditlog.Origin(v.Name(), prompts.CachedInfo().Created)
		return c.Size == want && c.Origin == origin, fmt.Sprintf("signed %d of %d (log %s, PROMPTS' %s)", c.Size, want, c.Origin, origin)
	})
	return c
}

// TestAuditLogShowsTampering: the archiver keeps the audit log over PROMPTS and signs
// checkpoints; `podium audit check`, with nothing but the public key, passes a log that only grew
// (also across an archiver killed and started again, and since a checkpoint kept from an earlier
// check), and names, with its position, a row forged into the archive at a new sequence, a row
// of the archive changed, a record deleted from PROMPTS, and that record then deleted from the
// archive too.
func TestAuditLogShowsTampering(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	keyFile, public := e.auditKey(t, "e2e-audit")
	e.start("ranker")
	e.start("composer")
	logged := keeping(keyFile)
	arch := e.start("archiver", logged...)
	check := func(args ...string) (string, int) { return e.auditCheck(t, public, args...) }

	first := e.play("audit-1", 3, 3)
	e.checkArchive("audit-1", first)
	c1 := signedUpTo(t, e.js, public)
	waitReadiness(t, arch, http.StatusOK, 30*time.Second)
	out, code := check()
	if code != 0 || !strings.Contains(out, "the log is whole") {
		t.Fatalf("audit check of a log that only grew: exit %d\n%s", code, out)
	}
	// A bundle carries the checkpoint and each prompt's inclusion proof: verified offline with the
	// public key alone; a record changed in it (one the render check would not see: the event's
	// source) is named with its position.
	bundle := filepath.Join(t.TempDir(), "audit-1.podium.json")
	if out, code := e.podium(t, []string{"AUDIT_PUBLIC_KEY=" + public}, "export", "--execution", "audit-1", "--out", bundle); code != 0 ||
		!strings.Contains(out, fmt.Sprintf("%d prompts proven in the signed audit log", first)) {
		t.Fatalf("export with the log's key: exit %d\n%s", code, out)
	}
	offline := []string{"NATS_URL=nats://127.0.0.1:1", "CLICKHOUSE_ADDR=127.0.0.1:1"}
	out, code = e.podium(t, offline, "prompts", "verify", "--bundle", bundle, "--key", public)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d of %d prompts proven in it", first, first)) {
		t.Fatalf("verify --bundle --key: exit %d\n%s", code, out)
	}
	raw, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	b, err := audit.ReadBundle(bytes.NewReader(raw), "the export", bounded.Limit{Bytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	changedSeq := b.Prompts[1].Seq
	b.Prompts[1].Event = strings.Replace(b.Prompts[1].Event, `"source":"`, `"source":"forged-`, 1)
	var buf bytes.Buffer
	if err := b.Write(&buf, false); err != nil {
		t.Fatal(err)
	}
	changed := filepath.Join(t.TempDir(), "changed.podium.json")
	if err := os.WriteFile(changed, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = e.podium(t, offline, "prompts", "verify", "--bundle", changed, "--key", public)
	if want := fmt.Sprintf("position %d (PROMPTS sequence %d): the prompt is not what the log signed", changedSeq-1, changedSeq); code != 1 || !strings.Contains(out, want) {
		t.Fatalf("verify --bundle --key of a bundle with a record changed: exit %d, want 1 and %q\n%s", code, want, out)
	}
	// The same change with its proof removed: a prompt the checkpoint signs must carry one.
	stripped := b
	for i, p := range stripped.Log.Proofs {
		if p.Seq == changedSeq {
			stripped.Log.Proofs = append(stripped.Log.Proofs[:i:i], stripped.Log.Proofs[i+1:]...)
			break
		}
	}
	buf.Reset()
	if err := stripped.Write(&buf, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(changed, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = e.podium(t, offline, "prompts", "verify", "--bundle", changed, "--key", public)
	if code != 1 || !strings.Contains(out, "the checkpoint signs it but the bundle carries no proof of it") {
		t.Fatalf("verify --bundle --key of a changed record with its proof removed: exit %d\n%s", code, out)
	}
	_, otherPublic := e.auditKey(t, "e2e-other")
	if out, code := e.podium(t, offline, "prompts", "verify", "--bundle", bundle, "--key", otherPublic); code != 1 || !strings.Contains(out, "not signed by the log's key") {
		t.Fatalf("verify --bundle with another key: exit %d\n%s", code, out)
	}
	// The log's key signing another log's checkpoint (not this key's PROMPTS log): refused by its
	// origin, whatever the signature.
	signer, verifier, err := auditlog.LoadKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	real, err := auditlog.Open([]byte(b.Log.Checkpoint), verifier)
	if err != nil {
		t.Fatal(err)
	}
	foreign := b
	log := *b.Log
	c, err := auditlog.Sign("elsewhere/PROMPTS/2026-01-01T00:00:00Z", real.Size, real.Root, signer)
	if err != nil {
		t.Fatal(err)
	}
	log.Checkpoint = string(c.Signed)
	foreign.Log = &log
	buf.Reset()
	if err := foreign.Write(&buf, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(changed, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := e.podium(t, offline, "prompts", "verify", "--bundle", changed, "--key", public); code != 1 || !strings.Contains(out, "not a PROMPTS log of key e2e-audit") {
		t.Fatalf("verify --bundle of a checkpoint of another log signed by the key: exit %d\n%s", code, out)
	}

	kept := filepath.Join(t.TempDir(), "checkpoint")
	if err := os.WriteFile(kept, c1.Signed, 0o600); err != nil {
		t.Fatal(err)
	}

	// Killed and started again: the keeper resumes from the last checkpoint and its edge.
	if err := arch.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-arch.done
	arch.done <- nil
	second := e.play("audit-2", 2, 2)
	arch = e.start("archiver", logged...)
	// A second replica shares the durable: each is delivered a share, and each keeper reads the
	// other's share from the stream; both sign the same checkpoints (a fork would be named).
	e.start("archiver", logged...)
	e.checkArchive("audit-2", second)
	c2 := signedUpTo(t, e.js, public)
	if c2.Size <= c1.Size {
		t.Fatalf("the log signed %d records after %d", c2.Size, c1.Size)
	}
	out, code = check("--since", kept)
	if code != 0 || !strings.Contains(out, "only grew since the checkpoint given") || !strings.Contains(out, "consistency proofs checked") {
		t.Fatalf("audit check --since a kept checkpoint: exit %d\n%s", code, out)
	}
	if n := arch.metric(t, "archiver_audit_checkpoints_total"); n < 1 {
		t.Errorf("archiver_audit_checkpoints_total = %v after a restart and more records", n)
	}

	const cols = `execution_id, team_id, round_number, event_id, event_type, request_id, template_name, template_version,
		evaluations_seq, prompt_sha256, subject, body, stream_created, stream_seq, stored_at_us`
	// A row forged at a sequence PROMPTS never stored, and a record's row changed (an earlier
	// stored_at: readers would take it as the record).
	e.storeExec(`INSERT INTO prompts (` + cols + `) SELECT execution_id, team_id, round_number, 'forged-1', event_type, request_id,
		template_name, template_version, evaluations_seq, prompt_sha256, subject, body, stream_created, 1000, stored_at_us
		FROM prompts WHERE stream_seq = 3 LIMIT 1`)
	e.storeExec(`INSERT INTO prompts (` + cols + `) SELECT execution_id, team_id, round_number, event_id, event_type, request_id,
		template_name, template_version, evaluations_seq, prompt_sha256, subject, replaceOne(body, 'Improve', 'Ignore'), stream_created,
		stream_seq, stored_at_us - 1 FROM prompts WHERE stream_seq = 5 LIMIT 1`)
	out, code = check()
	if code != 1 || !strings.Contains(out, "position 999: the archive holds a row (event id forged-1) at sequence 1000, which PROMPTS never stored") ||
		!strings.Contains(out, "position 4: the archive's row") {
		t.Fatalf("audit check after forging archive rows: exit %d\n%s", code, out)
	}

	// PROMPTS refuses deletes, and no stream update may lift that; what an operator's credential
	// can do is shorten its retention: the first records go from the stream, which is not a
	// finding while the archive holds them...
	st, err := e.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgs = int64(st.CachedInfo().State.Msgs) - 8 // sequences 1-8 go
	if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	out, code = check("--json")
	if code != 1 || strings.Contains(out, "PROMPTS nor the archive") || strings.Contains(out, `"position": 6`) {
		t.Fatalf("audit check after PROMPTS' retention trimmed what the archive holds: exit %d\n%s", code, out)
	}
	// ...but once the archive's copy of one of them is deleted too, it is held nowhere: named,
	// and every signed root above it is said to be beyond checking.
	e.storeExec(`ALTER TABLE prompts DELETE WHERE stream_seq = 7`)
	testenv.WaitFor(t, 30*time.Second, "the record gone from both named", func() (bool, string) {
		out, code = check()
		return code == 1 && strings.Contains(out, "position 6: sequence 7 is in neither PROMPTS nor the archive") &&
			strings.Contains(out, "cannot be checked: position 6 is held nowhere"), out
	})
	t.Logf("audit check names what was done:\n%s", out)

	// The keeper is not fooled either: it signed before the deletions, and keeps signing what
	// comes after them.
	third := e.play("audit-3", 2, 1)
	e.checkArchive("audit-3", third)
	if c3 := signedUpTo(t, e.js, public); c3.Size <= c2.Size {
		t.Errorf("the log signed %d records after %d", c3.Size, c2.Size)
	}
}

// TestAuditCheckReadsTheLogsOfDeletedStreams: PROMPTS deleted and made again begins a new log;
// the old one's records are in the archive alone, and `podium audit check` checks them too,
// against the old log's signed checkpoints: whole, then a row of it deleted from the archive,
// named with its position in that log.
func TestAuditCheckReadsTheLogsOfDeletedStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	keyFile, public := e.auditKey(t, "e2e-older")
	e.start("ranker")
	e.start("composer")
	e.start("archiver", keeping(keyFile)...)
	check := func() (string, int) { return e.auditCheck(t, public) }

	first := e.play("older-1", 2, 2)
	e.checkArchive("older-1", first)
	signedUpTo(t, e.js, public)
	st, err := e.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	old := st.CachedInfo().Created.UTC().Format(time.RFC3339Nano)
	if err := e.js.DeleteStream(t.Context(), events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	second := e.play("older-2", 2, 2) // the composer makes PROMPTS again
	e.checkArchive("older-2", second)
	signedUpTo(t, e.js, public)

	out, code := check()
	oldLog := "log e2e-older/PROMPTS/" + old + " (a PROMPTS deleted since"
	if code != 0 || !strings.Contains(out, oldLog) || !strings.Contains(out, "the log is whole: the archive holds exactly what its signed tree holds") ||
		!strings.Contains(out, fmt.Sprintf("the archive %d rows", first)) {
		t.Fatalf("audit check after PROMPTS was made again: exit %d, want 0 and the old log (%d rows) whole\n%s", code, first, out)
	}
	e.storeExec(fmt.Sprintf(`ALTER TABLE prompts DELETE WHERE stream_created = '%s' AND stream_seq = 2`, old))
	testenv.WaitFor(t, 30*time.Second, "the old log's row deleted from the archive named", func() (bool, string) {
		out, code = check()
		return code == 1 && strings.Contains(out, "position 1: sequence 2 is in neither PROMPTS nor the archive"), out
	})
	t.Logf("audit check names what was done to the log of the PROMPTS deleted:\n%s", out)
}

// TestAuditLogBegunOnATrimmedStream: a signing key given to the archiver only after PROMPTS'
// retention trimmed its first records: the log takes those from the archive (which kept them),
// signs the stream whole, and checks whole. (Before: its keeper stopped at position 0, missing
// from PROMPTS, and the archiver stayed unready.)
func TestAuditLogBegunOnATrimmedStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	keyFile, public := e.auditKey(t, "e2e-trimmed")
	e.start("ranker")
	e.start("composer")
	arch := e.start("archiver")
	first := e.play("trimmed-1", 2, 3)
	e.checkArchive("trimmed-1", first)
	st, err := e.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgs = int64(st.CachedInfo().State.Msgs) - 3 // sequences 1-3 go
	if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	if err := arch.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-arch.done
	arch.done <- nil
	arch = e.start("archiver", keeping(keyFile)...)
	c := signedUpTo(t, e.js, public)
	waitReadiness(t, arch, http.StatusOK, 30*time.Second)
	out, code := e.auditCheck(t, public)
	if code != 0 || !strings.Contains(out, "the log is whole") {
		t.Fatalf("audit check of a log begun on a trimmed PROMPTS: exit %d\n%s", code, out)
	}
	t.Logf("the log signs %d records, the first 3 from the archive:\n%s", c.Size, out)
}

// TestAuditCheckKeepsTheRowsOfAStreamWithoutALogOut: S1 (the key's log), Sx (an archiver without
// a key: no log), S3 (the key's log). A record of Sx the archiver handled after Sx was deleted says
// "deleted before" S3's creation (here a row relabelled so): it is Sx's, no log's, and not taken
// for S1's (a review found it named S1's record as forged).
func TestAuditCheckKeepsTheRowsOfAStreamWithoutALogOut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	keyFile, public := e.auditKey(t, "e2e-between")
	e.start("ranker")
	e.start("composer")
	keyed := keeping(keyFile)
	arch := e.start("archiver", keyed...)
	created := func() string {
		st, err := e.js.Stream(t.Context(), events.StreamPrompts)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Created.UTC().Format(time.RFC3339Nano)
	}
	remake := func(archiver ...string) {
		arch.stop(t, 10*time.Second)
		if err := e.js.DeleteStream(t.Context(), events.StreamPrompts); err != nil {
			t.Fatal(err)
		}
		arch = e.start("archiver", archiver...)
	}
	n := e.play("between-1", 2, 2)
	e.checkArchive("between-1", n)
	signedUpTo(t, e.js, public)
	remake() // no key: Sx has no log
	n = e.play("between-x", 2, 2)
	e.checkArchive("between-x", n)
	sx := created()
	remake(keyed...)
	n = e.play("between-3", 2, 2)
	e.checkArchive("between-3", n)
	signedUpTo(t, e.js, public)
	s3 := created()
	e.storeExec(fmt.Sprintf(`ALTER TABLE prompts UPDATE stream_created = 'deleted before %s' WHERE stream_created = '%s' AND stream_seq = 1`, s3, sx))
	e.waitMutations(t)
	out, code := e.auditCheck(t, public)
	if code != 0 || strings.Contains(out, "not the record") || !strings.Contains(out, "(a PROMPTS deleted since") {
		t.Fatalf("audit check with a row of a stream without a log saying 'deleted before' the next: exit %d\n%s", code, out)
	}
}

// TestAuditLogHoldsAMessageThatIsNotARecord: a message of PROMPTS that is not a record is
// dead-lettered by the archiver, and its bytes are kept in the archive at its position for the
// audit log: once PROMPTS' retention trims it, the check finds the position held and the log
// whole. (Before: "in neither PROMPTS nor the archive", and every checkpoint above it beyond
// checking.)
func TestAuditLogHoldsAMessageThatIsNotARecord(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	keyFile, public := e.auditKey(t, "e2e-junk")
	e.start("ranker")
	e.start("composer")
	e.start("archiver", keeping(keyFile)...)
	first := e.play("junk-1", 2, 2)
	e.checkArchive("junk-1", first)
	e.publishRaw(events.PromptComposedSubject("junk-1", "t"), "junk-1", []byte(`{"not": "a cloudevent"`))
	if dl := e.collect(events.StreamDeadLetter, "deadletter.>", 1, 20*time.Second); len(dl) != 1 {
		t.Fatalf("dead letters: %+v", dl)
	}
	second := e.play("junk-2", 2, 2)
	e.checkArchive("junk-2", second)
	signedUpTo(t, e.js, public)
	st, err := e.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgs = int64(second) - 1 // the records of junk-1, the junk after them, and one more go
	if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	out, code := e.auditCheck(t, public)
	if code != 0 || !strings.Contains(out, "the log is whole") {
		t.Fatalf("audit check once PROMPTS' retention trimmed a message that is not a record: exit %d\n%s", code, out)
	}
}
