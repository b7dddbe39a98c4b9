package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/bounded"
	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// archived reads the archive of an execution as the readers do (one row per event id).
func (e *env) archived(exec string) []chstore.ArchivedPrompt {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs := strings.Split(e.chAddr, ",")
	st, err := chstore.Open(ctx, chstore.Config{Addrs: addrs, Database: e.database, Replication: chstore.Replication{Enabled: len(addrs) > 1}})
	if err != nil {
		e.t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: exec})
	if err != nil && !strings.Contains(err.Error(), "doesn't exist") {
		e.t.Fatal(err)
	}
	return recs
}

// checkArchive waits until the archive of exec holds exactly what PROMPTS holds of it: the same
// records, byte for byte, at the same sequences, each once.
func (e *env) checkArchive(exec string, n int) {
	e.t.Helper()
	stream := e.collect(events.StreamPrompts, "prompt.*."+exec+".*", n, 20*time.Second)
	if len(stream) != n {
		e.t.Fatalf("PROMPTS holds %d records of %s, want %d", len(stream), exec, n)
	}
	var got []chstore.ArchivedPrompt
	testenv.WaitFor(e.t, 30*time.Second, fmt.Sprintf("%d records of %s archived", n, exec), func() (bool, string) {
		got = e.archived(exec)
		return len(got) >= n, fmt.Sprintf("%d archived", len(got))
	})
	if len(got) != n {
		e.t.Fatalf("the archive holds %d records of %s, PROMPTS %d", len(got), exec, n)
	}
	for i, m := range stream {
		a := got[i]
		if a.Seq != m.Seq || a.Subject != m.Subject || !bytes.Equal(a.Body, m.Body) || !a.Stored.Equal(m.Time.UTC().Truncate(time.Microsecond)) {
			e.t.Errorf("record %d of %s: archived seq %d %s (%d bytes, stored %s), stream seq %d %s (%d bytes, stored %s)",
				i, exec, a.Seq, a.Subject, len(a.Body), a.Stored, m.Seq, m.Subject, len(m.Body), m.Time)
		}
		env := dataOf(e.t, m.Body, &struct{}{})
		if a.EventID != env.ID || a.EventType != env.Type {
			e.t.Errorf("record %d of %s: archived as %s %s, is %s %s", i, exec, a.EventType, a.EventID, env.Type, env.ID)
		}
	}
}

// play answers rounds 2 to rounds+1 of teams teams of exec (each after the team's evaluation of the
// round before) and returns how many prompts PROMPTS holds of it then.
func (e *env) play(exec string, teams, rounds int) int {
	e.t.Helper()
	for r := 1; r <= rounds; r++ {
		for k := range teams {
			team := fmt.Sprintf("team-%d", k)
			ev := evaluation(exec, team, "Team "+team, r, float64(10*r+k), fmt.Sprintf("%s %s answer of round %d", exec, team, r), t0.Add(time.Duration(r)*time.Minute))
			e.publishEvaluation(fmt.Sprintf("ev-%s-%s-%d", exec, team, r), ev)
			e.requestRound(fmt.Sprintf("req-%s-%s-%d", exec, team, r+1), events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team,
				RoundNumber: r + 1, UserPrompt: "Improve.", MaxRounds: rounds + 1}, t0.Add(time.Duration(r)*time.Minute+time.Second))
		}
	}
	n := teams * rounds
	for _, a := range e.answers("prompt.*."+exec+".*", n, 30*time.Second) {
		if !a.ok() {
			e.t.Errorf("%s: %s %+v", exec, a.subject, a.failed)
		}
	}
	return n
}

// TestArchive: every prompt.composed and prompt.failed lands in the archive once per event id,
// byte for byte: through an archiver killed with SIGKILL and started again (what it held is
// delivered again), the prompts table dropped (made again and filled from PROMPTS), and a record that is not a prompt record
// (dead-lettered, the others go on).
func TestArchive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	arch := e.start("archiver", "ARCHIVER_ACK_WAIT=2s")

	first := e.play("arch-1", 3, 3)
	e.checkArchive("arch-1", first)
	// The rows are in ClickHouse a moment before the archiver counts them.
	testenv.WaitFor(t, 10*time.Second, "archiver_lag_seconds_count to count the records", func() (bool, string) {
		n := arch.metric(t, "archiver_lag_seconds_count")
		return n >= float64(first), fmt.Sprintf("%v, want at least %d", n, first)
	})

	t.Run("a record that is not a prompt record is dead-lettered", func(t *testing.T) {
		e.publishRaw(events.PromptComposedSubject("arch-bad", "t"), "junk-1", []byte(`{"not": "a cloudevent"`))
		dl := e.collect(events.StreamDeadLetter, "deadletter.>", 1, 20*time.Second)
		if len(dl) != 1 || dl[0].Header.Get("Dead-Stream") != events.StreamPrompts {
			t.Fatalf("dead letters: %+v", dl)
		}
		if why := dl[0].Header.Get("Dead-Reason"); !strings.Contains(why, "not a CloudEvent") {
			t.Errorf("Dead-Reason = %q", why)
		}
	})

	t.Run("killed and started again: each record once", func(t *testing.T) {
		if err := arch.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-arch.done
		arch.done <- nil
		second := e.play("arch-2", 3, 2)
		arch = e.start("archiver", "ARCHIVER_ACK_WAIT=2s")
		e.checkArchive("arch-2", second)
		e.checkArchive("arch-1", first)
	})

	t.Run("its durable deleted: made again naming the same lineage", func(t *testing.T) {
		ctx := t.Context()
		before, err := consumerInfo(ctx, e.js, events.StreamPrompts, events.ConsumerArchiver)
		if err != nil {
			t.Fatal(err)
		}
		lineage := before.Config.Metadata[events.MetaArchiveLineage]
		if lineage == "" || before.Config.Metadata[events.MetaArchiveAnchor] == "" {
			t.Fatalf("the archiver's consumer names no lineage and anchor: %v", before.Config.Metadata)
		}
		if err := e.js.DeleteConsumer(ctx, events.StreamPrompts, events.ConsumerArchiver); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 30*time.Second, "the archiver's consumer made again with its lineage", func() (bool, string) {
			info, err := consumerInfo(ctx, e.js, events.StreamPrompts, events.ConsumerArchiver)
			if err != nil {
				return false, err.Error()
			}
			return info.Config.Metadata[events.MetaArchiveLineage] == lineage, fmt.Sprint(info.Config.Metadata)
		})
		e.play("arch-2b", 2, 1)
		e.checkArchive("arch-2b", 2)
	})

	t.Run("a column dropped by hand: records held, unready naming it, archived once it is back", func(t *testing.T) {
		e.storeExec("ALTER TABLE prompts DROP COLUMN template_name")
		n := e.play("arch-col", 2, 1)
		testenv.WaitFor(t, 20*time.Second, "the archiver unready naming the refusal", func() (bool, string) {
			code, body := readiness(arch)
			return code == http.StatusServiceUnavailable && strings.Contains(body, "clickhouse refuses the records"), fmt.Sprint(code, " ", body)
		})
		if dl := e.collect(events.StreamDeadLetter, "deadletter.>", 2, time.Second); len(dl) != 1 { // the junk record of before only
			t.Errorf("%d dead letters, want 1: a refused record must be held, not dead-lettered", len(dl))
		}
		e.storeExec("ALTER TABLE prompts ADD COLUMN template_name String AFTER request_id")
		e.checkArchive("arch-col", n)
		waitReadiness(t, arch, http.StatusOK, 30*time.Second)
	})

	t.Run("the table dropped: made again and filled from PROMPTS", func(t *testing.T) {
		e.storeExec("DROP TABLE prompts")
		// No record arrives: the archiver finds the table gone by itself and fills it again.
		testenv.WaitFor(t, 30*time.Second, "the archive filled again while idle", func() (bool, string) {
			n := arch.metric(t, "archiver_refills_total")
			return n == 1, fmt.Sprint(n)
		})
		third := e.play("arch-3", 2, 2)
		e.checkArchive("arch-3", third)
		e.checkArchive("arch-1", first)
		e.checkArchive("arch-2", 6)
		if n := arch.metric(t, "archiver_refills_total"); n != 1 {
			t.Errorf("archiver_refills_total = %v, want 1", n)
		}
		if !strings.Contains(arch.logs.String(), "prompts archive made again and filled from PROMPTS") {
			t.Errorf("no log line of the refill:\n%s", arch.logs)
		}
	})

	t.Run("readers take archived records from ClickHouse, scan no stream, and name a changed row", func(t *testing.T) {
		creates := e.consumerCreates(t)
		out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", "arch-1")
		if code != 0 || !strings.Contains(out, "9 record(s) verified") {
			t.Fatalf("verify --all: exit %d\n%s", code, out)
		}
		out, code = e.podium(t, nil, "prompts", "show", "arch-1", "team-1", "3")
		if code != 0 || !strings.Contains(out, "read from the ClickHouse archive") || !strings.Contains(out, "arch-1 team-1 answer of round 2") {
			t.Fatalf("show: exit %d\n%s", code, out)
		}
		out, code = e.podium(t, nil, "prompts", "diff", "arch-1", "team-1", "2", "3")
		if code != 0 || !strings.Contains(out, "+") {
			t.Fatalf("diff: exit %d\n%s", code, out)
		}
		// The console's round page of an archived record, and with ?verify=1.
		console := e.start("console")
		for _, path := range []string{"/executions/arch-1/teams/team-1/rounds/3", "/executions/arch-1/teams/team-1/rounds/3?verify=1"} {
			page, err := httpGet("http://" + console.addr + path)
			if err != nil || !strings.Contains(page, "arch-1 team-1 answer of round 2") ||
				strings.Contains(path, "verify") && !strings.Contains(page, "verified: rendering the request again") {
				t.Errorf("GET %s: %v\n%.3000s", path, err, page)
			}
		}
		if n := creates.Load(); n != 0 {
			t.Errorf("reading archived records created %d consumers on PROMPTS, want 0 (no stream scan)", n)
		}

		// A column changed by hand: the row says what its body does not.
		e.storeExec("ALTER TABLE prompts UPDATE evaluations_seq = 999999 WHERE execution_id = 'arch-1' AND team_id = 'team-2' AND round_number = 3")
		e.waitMutations(t)
		out, code = e.podium(t, nil, "prompts", "verify", "arch-1", "team-2", "3")
		if code != 1 || !strings.Contains(out, "team-2 round 3") || !strings.Contains(out, "was changed in ClickHouse: its evaluations_seq is 999999") {
			t.Errorf("verify of a changed column: exit %d\n%s", code, out)
		}
		// The body changed by hand: it renders differently from what it records.
		e.storeExec("ALTER TABLE prompts UPDATE body = replaceOne(body, 'answer of round 1', 'answer of round 7') WHERE execution_id = 'arch-1' AND team_id = 'team-0' AND round_number = 2")
		e.waitMutations(t)
		out, code = e.podium(t, nil, "prompts", "verify", "arch-1", "team-0", "2")
		if code != 1 || !strings.Contains(out, "arch-1 team-0 round 2") || !strings.Contains(out, "read from the ClickHouse archive) differs") {
			t.Errorf("verify of a changed body: exit %d\n%s", code, out)
		}
	})
}

// consumerCreates counts the consumers made on PROMPTS from now on (a stream scan makes one).
func (e *env) consumerCreates(t *testing.T) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := e.nc.Subscribe("$JS.API.CONSUMER.CREATE."+events.StreamPrompts+".>", func(*nats.Msg) { n.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

// waitMutations waits until ClickHouse has applied every ALTER ... UPDATE of the test's database.
func (e *env) waitMutations(t *testing.T) {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{e.chAddr}, Auth: clickhouse.Auth{Database: e.database}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testenv.WaitFor(t, 20*time.Second, "mutations applied", func() (bool, string) {
		var n uint64
		err := conn.QueryRow(context.Background(), "SELECT count() FROM system.mutations WHERE database = ? AND is_done = 0", e.database).Scan(&n)
		return err == nil && n == 0, fmt.Sprint(n, err)
	})
}

// TestExportBundleVerifiesOffline: `podium export` writes one execution's evaluations (a replay
// and a re-evaluation among them), prompts and templates to one file, the same bytes each time;
// `podium prompts verify --bundle` proves every prompt from it with NATS and ClickHouse out of
// reach, and names the record that a changed score no longer renders.
func TestExportBundleVerifiesOffline(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	e.start("archiver")
	const exec = "bundle"
	n := e.play(exec, 3, 3)
	// A replay of an id (stored again, counted once) and a re-evaluation (a new id, later), then
	// the next round of that team.
	ev := evaluation(exec, "team-1", "Team team-1", 3, 99.5, "a better answer of round 3", t0.Add(time.Hour))
	e.publishEvaluation("ev-bundle-team-1-3-again", ev)
	e.publishRaw(events.EvaluationSubject(exec, "team-2"), "ev-bundle-team-2-3-replay", mustMarshal(t, published{id: "ev-bundle-team-2-3",
		ev: evaluation(exec, "team-2", "Team team-2", 3, 1, "replayed", t0.Add(2*time.Hour))}))
	e.requestRound("req-bundle-team-1-5", events.RoundRequested{ExecutionID: exec, TeamID: "team-1", TeamName: "Team team-1",
		RoundNumber: 5, UserPrompt: "Improve.", MaxRounds: 5}, t0.Add(3*time.Hour))
	n++
	e.answers("prompt.*."+exec+".*", n, 20*time.Second)
	e.checkArchive(exec, n)

	dir := t.TempDir()
	file := filepath.Join(dir, "bundle.podium.json.gz")
	out, code := e.podium(t, nil, "export", "--execution", exec, "--out", file)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d prompts", n)) {
		t.Fatalf("export: exit %d\n%s", code, out)
	}
	first, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(dir, "again.podium.json.gz")
	if out, code := e.podium(t, nil, "export", "--execution", exec, "--out", again); code != 0 {
		t.Fatalf("export again: exit %d\n%s", code, out)
	}
	if second, _ := os.ReadFile(again); !bytes.Equal(first, second) {
		t.Error("the same execution exported to different bytes")
	}

	// No servers: NATS and ClickHouse addresses nobody answers.
	offline := []string{"NATS_URL=nats://127.0.0.1:1", "CLICKHOUSE_ADDR=127.0.0.1:1"}
	out, code = e.podium(t, offline, "prompts", "verify", "--bundle", file)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d record(s) verified", n)) {
		t.Fatalf("verify --bundle: exit %d\n%s", code, out)
	}

	// A score changed in the bundle: the prompts that showed it differ.
	b, err := audit.ReadBundle(bytes.NewReader(first), "the export", bounded.Limit{Bytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	for i := range b.Evaluations {
		if b.Evaluations[i].EventID == "ev-bundle-team-0-1" {
			b.Evaluations[i].Data.Evaluation.OverallScore = 12.25
		}
	}
	var buf bytes.Buffer
	if err := b.Write(&buf, false); err != nil {
		t.Fatal(err)
	}
	changed := filepath.Join(dir, "changed.json")
	if err := os.WriteFile(changed, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = e.podium(t, offline, "prompts", "verify", "--bundle", changed)
	if code != 1 || !strings.Contains(out, "bundle team-") || !strings.Contains(out, "differs") {
		t.Errorf("verify of a changed bundle: exit %d\n%s", code, out)
	}
}

// TestAnArchiveLossIsNamedUntilAccepted: records archived from a PROMPTS since deleted are kept only
// in the archive; when its table is then emptied, a refill from the stream there is now would call a
// shorter archive whole. The archiver names the loss instead: unready naming the eras, archiving
// nothing (records of the new stream wait, unacknowledged), readers reading the stream alone, until
// an operator accepts it (`podium store accept-loss --archive`, on AUDIT); then it fills the table
// from the stream there is now, in the next era, and is ready.
func TestAnArchiveLossIsNamedUntilAccepted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	arch := e.start("archiver")
	before := e.play("lost-0", 2, 1)
	e.checkArchive("lost-0", before)

	if err := e.js.DeleteStream(t.Context(), events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	// The archiver makes PROMPTS again and begins its era once it consumes it.
	testenv.WaitFor(t, 60*time.Second, "the archive's lineage in era 1", func() (bool, string) {
		info, err := consumerInfo(t.Context(), e.js, events.StreamPrompts, events.ConsumerArchiver)
		if err != nil {
			return false, err.Error()
		}
		return info.Config.Metadata[events.MetaArchiveEra] == "1", fmt.Sprint(info.Config.Metadata)
	})
	after := e.play("lost-1", 2, 1)
	e.checkArchive("lost-1", after)
	if got := e.archived("lost-0"); len(got) != before || got[0].Era != 0 {
		t.Fatalf("the records of the deleted PROMPTS: %d archived, want %d in era 0", len(got), before)
	}
	if got := e.archived("lost-1"); len(got) != after || got[0].Era != 1 {
		t.Fatalf("the records of the PROMPTS made again: %d archived (era %d), want %d in era 1", len(got), got[0].Era, after)
	}

	e.storeExec("TRUNCATE TABLE prompts")
	testenv.WaitFor(t, 30*time.Second, "the archiver to name the loss", func() (bool, string) {
		code, body := readiness(arch)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "prompt records lost") && strings.Contains(body, "era 0"), fmt.Sprint(code, body)
	})
	during := e.play("lost-2", 1, 1) // records that arrive during the loss: archived once it is accepted
	time.Sleep(2 * time.Second)      // bounded: what must not happen has had its chance
	if got := e.archived("lost-2"); len(got) != 0 {
		t.Errorf("%d records archived while the archive's loss waited for an operator", len(got))
	}
	if n, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", "lost-1"); code != 0 || !strings.Contains(n, "record(s) verified") {
		t.Errorf("verify while the archive waits (the stream read alone): exit %d\n%s", code, n)
	}

	out, code := e.podium(t, nil, "store", "accept-loss", "--archive")
	lineage := ""
	if i := strings.Index(out, "--lineage "); i >= 0 {
		lineage = strings.Fields(out[i+len("--lineage "):])[0]
	}
	if code == 0 || lineage == "" || !strings.Contains(out, "prompt records of eras 0-0") {
		t.Fatalf("podium store accept-loss --archive without --lineage: exit %d, want non-zero naming the loss and its lineage\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "store", "accept-loss", "--lineage", lineage, "--reason", "x"); code == 0 {
		t.Errorf("accept-loss of the store (which lost nothing) with the archive's lineage: exit 0\n%s", out)
	}
	if out, code := e.podium(t, nil, "store", "accept-loss", "--archive", "--lineage", lineage, "--reason", "PROMPTS of era 0 has no backup"); code != 0 {
		t.Fatalf("accept-loss --archive: exit %d\n%s", code, out)
	}
	waitReadiness(t, arch, http.StatusOK, 60*time.Second)
	e.checkArchive("lost-1", after)
	e.checkArchive("lost-2", during)
	audit, err := e.js.Stream(t.Context(), events.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	m, err := audit.GetLastMsgForSubject(t.Context(), events.SubjectArchiveLossAccepted)
	if err != nil || !strings.Contains(string(m.Data), lineage) || !strings.Contains(string(m.Data), "no backup") {
		t.Fatalf("the accepted loss on AUDIT: %v %v", m, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(m.Data))
	if err != nil {
		t.Fatal(err)
	}
	if err := compileSchema(t, filepath.Join("..", "schemas", "audit", "loss.schema.json")).Validate(doc); err != nil {
		t.Errorf("the accepted loss on AUDIT does not match schemas/audit/loss.schema.json: %v\n%s", err, m.Data)
	}
	info, err := consumerInfo(t.Context(), e.js, events.StreamPrompts, events.ConsumerArchiver)
	if err != nil || info.Config.Metadata[events.MetaArchiveLoss] != "" || info.Config.Metadata[events.MetaArchiveFloor] != "1" {
		t.Errorf("the archiver's consumer after the acceptance: %v (%v), want no loss and floor 1", info.Config.Metadata, err)
	}
}
