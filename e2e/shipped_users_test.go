package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// natsRoles are the users of deploy/nats/nats.conf.
var natsRoles = []string{"orchestrator", "ranker", "ranker-api", "composer", "composer-api", "archiver", "console", "auditor", "author", "release", "operator"}

// passwordVar is the variable of deploy/nats/nats.conf that holds role's password.
func passwordVar(role string) string {
	return "PODIUM_" + strings.ToUpper(strings.ReplaceAll(role, "-", "_")) + "_PASSWORD"
}

// shippedNATS starts an in-process server from deploy/nats/nats.conf as shipped, with each role's
// password in the environment (PODIUM_<ROLE>_PASSWORD = <role>-pw); only what a test machine
// needs is changed: the addresses (loopback, a free port, no monitoring port) and the store.
func shippedNATS(t *testing.T) *server.Server {
	t.Helper()
	// The server reads them from the process's environment (t.Setenv refuses a parallel test);
	// nothing else of the suite reads these names.
	for _, role := range natsRoles {
		if err := os.Setenv(passwordVar(role), role+"-pw"); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := server.ProcessConfigFile(filepath.Join("..", "deploy", "nats", "nats.conf"))
	if err != nil {
		t.Fatalf("deploy/nats/nats.conf: %v", err)
	}
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", -1, 0, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server from deploy/nats/nats.conf did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// connectAs connects as role; denied hears the server refuse one of its publishes.
func connectAs(t *testing.T, ns *server.Server, role string) (nc *nats.Conn, denied chan error) {
	t.Helper()
	denied = make(chan error, 16)
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(role, role+"-pw"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case denied <- err:
			default:
			}
		}
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	return nc, denied
}

// refused checks that the server refuses role's publish to subject.
func refused(t *testing.T, ns *server.Server, role, subject string) {
	t.Helper()
	nc, denied := connectAs(t, ns, role)
	if err := nc.Publish(subject, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-denied:
		if !strings.Contains(err.Error(), subject) {
			t.Errorf("%s publishing to %s: refused for %v", role, subject, err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("%s may publish to %s, want it refused", role, subject)
	}
}

// roleEnv is the configuration of a service or the CLI run as role: its NATS user, and its
// ClickHouse user where it has one (the composer also its user for answering requests).
func roleEnv(role string) []string {
	env := []string{"NATS_USER=" + role, "NATS_PASSWORD=" + role + "-pw"}
	switch role {
	case "composer":
		env = append(env, "COMPOSER_API_NATS_USER=composer-api", "COMPOSER_API_NATS_PASSWORD=composer-api-pw")
	case "ranker":
		env = append(env, "RANKER_API_NATS_USER=ranker-api", "RANKER_API_NATS_PASSWORD=ranker-api-pw")
	}
	switch role {
	case "ranker", "archiver", "composer", "console", "auditor":
		env = append(env, "CLICKHOUSE_USER="+role, "CLICKHOUSE_PASSWORD="+role+"-pw")
	}
	return env
}

// shippedClickHouse starts a private clickhouse-server with deploy/clickhouse/users.d/podium.xml
// as shipped, each user's password in the environment (PODIUM_CH_<USER>_PASSWORD = <user>-pw).
func shippedClickHouse(t *testing.T) *servers.ClickHouse {
	t.Helper()
	for _, user := range []string{"ranker", "archiver", "composer", "console", "auditor"} {
		if err := os.Setenv("PODIUM_CH_"+strings.ToUpper(user)+"_PASSWORD", user+"-pw"); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	users, err := os.ReadFile(filepath.Join("..", "deploy", "clickhouse", "users.d", "podium.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "users.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.d", "podium.xml"), users, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	ch, err := servers.StartClickHouse(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Stop() })
	return ch
}

// chAs runs q on ch as user; its error.
func chAs(t *testing.T, ch *servers.ClickHouse, user, q string) error {
	t.Helper()
	password := user + "-pw"
	if user == "default" {
		password = "" // the server's own user, from its host only
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr}, Auth: clickhouse.Auth{Username: user, Password: password}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.Exec(t.Context(), q)
}

// TestShippedUsers: the NATS server and the ClickHouse users of deploy/ are secure by default.
// An anonymous NATS client is refused; the pipeline runs with each service under its own NATS and
// ClickHouse users (an evaluation ranked, a request answered, the answer archived, the console's
// page read, an auditor's verify); and each role is refused what is not its job: an orchestrator
// cannot answer requests, manage streams or take the services' consumers; the services cannot
// publish each other's events; the console and auditors publish nothing; an author may move a
// label but not production, which the release user may; the composer's, the console's and the
// auditors' ClickHouse users cannot write.
func TestShippedUsers(t *testing.T) {
	t.Parallel()
	ns := shippedNATS(t)
	if nc, err := nats.Connect(ns.ClientURL()); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("an anonymous client: %v, want refused", err)
	}

	ch := shippedClickHouse(t)
	orch, _ := connectAs(t, ns, "orchestrator")
	js, err := jetstream.New(orch)
	if err != nil {
		t.Fatal(err)
	}
	// The shipped users reach the database of CLICKHOUSE_DATABASE's default only (allow_databases).
	e := &env{t: t, ns: ns, nc: orch, js: js, chAddr: ch.Addr, database: "rounds"}
	as := roleEnv
	keyFile, public := e.auditKey(t, "shipped")
	procs := []*proc{e.start("ranker", as("ranker")...), e.start("composer", as("composer")...),
		e.start("archiver", append(as("archiver"), "ARCHIVER_AUDIT_SIGNING_KEY_FILE="+keyFile, "ARCHIVER_AUDIT_CHECKPOINT_INTERVAL=200ms")...)}
	console := e.start("console", as("console")...)
	procs = append(procs, console)

	const exec = "secure"
	e.publishEvaluation("sec-1", evaluation(exec, "t1", "Team t1", 1, 70, "the first answer", t0))
	e.requestRound("sec-req", events.RoundRequested{ExecutionID: exec, TeamID: "t1", TeamName: "Team t1", RoundNumber: 2, UserPrompt: "Again."}, t0.Add(time.Hour))
	a := e.answers("prompt.*."+exec+".*", 1, 30*time.Second)["sec-req"]
	if !a.ok() || !strings.Contains(a.composed.Prompt, "the first answer") {
		t.Fatalf("the request under the shipped users: %s %+v\n%s", a.subject, a.failed, a.composed.Prompt)
	}
	e.checkArchive(exec, 1)
	for _, user := range []string{"composer", "console", "auditor"} {
		for _, q := range []string{"INSERT INTO rounds.evaluations (event_id) VALUES ('forged')", "DROP TABLE rounds.prompts", "CREATE DATABASE forged"} {
			if err := chAs(t, ch, user, q); err == nil || !strings.Contains(strings.ToLower(err.Error()), "readonly") {
				t.Errorf("ClickHouse user %s: %s: %v, want refused as read-only", user, q, err)
			}
		}
	}
	// No user reaches another database: the default's, made here as an operator would.
	if err := chAs(t, ch, "default", "CREATE TABLE default.other (x UInt8) ENGINE = Memory"); err != nil {
		t.Fatalf("the default user: %v", err)
	}
	for _, user := range []string{"ranker", "archiver", "composer", "console", "auditor"} {
		for _, q := range []string{"SELECT count() FROM default.other", "DROP TABLE default.other", "CREATE DATABASE forged"} {
			if err := chAs(t, ch, user, q); err == nil {
				t.Errorf("ClickHouse user %s: %s: allowed, want refused (allow_databases)", user, q)
			}
		}
	}
	if status, page := getPage(t, "http://"+console.addr+"/executions/"+exec); status != http.StatusOK || !strings.Contains(page, "t1") {
		t.Errorf("the console's page under its user: %d\n%.1000s", status, page)
	}
	if out, code := e.podium(t, as("auditor"), "prompts", "verify", "--all", "--execution", exec); code != 0 {
		t.Errorf("an auditor's verify: exit %d\n%s", code, out)
	}
	// The archiver keeps the audit log under its user; an auditor checks it under theirs.
	operator, _ := connectAs(t, ns, "operator")
	opJS, err := jetstream.New(operator)
	if err != nil {
		t.Fatal(err)
	}
	signedUpTo(t, opJS, public)
	if out, code := e.podium(t, append(as("auditor"), "AUDIT_PUBLIC_KEY="+public), "audit", "check"); code != 0 || !strings.Contains(out, "the log is whole") {
		t.Errorf("an auditor's audit check: exit %d\n%s", code, out)
	}

	for _, c := range []struct{ role, subject string }{
		{"orchestrator", events.PromptComposedSubject(exec, "t1")},
		{"orchestrator", "$JS.API.STREAM.DELETE." + events.StreamEvaluations},
		{"orchestrator", "$JS.API.CONSUMER.DELETE." + events.StreamRounds + "." + events.ConsumerComposer},
		{"orchestrator", "$JS.API.CONSUMER.MSG.NEXT." + events.StreamEvaluations + "." + events.ConsumerRanker},
		{"orchestrator", "$KV.TEMPLATES.greet.label.production"},
		{"ranker", events.PromptComposedSubject(exec, "t1")},
		{"ranker", events.RoundSubject(exec, "t1")},
		{"composer", events.EvaluationSubject(exec, "t1")},
		{"composer", "$JS.API.STREAM.DELETE." + events.StreamEvaluations},
		{"archiver", events.PromptComposedSubject(exec, "t1")},
		{"archiver", "$JS.API.STREAM.DELETE." + events.StreamPrompts},
		{"console", events.RoundSubject(exec, "t1")},
		{"console", "$JS.API.CONSUMER.DELETE." + events.StreamEvaluations + "." + events.ConsumerRanker},
		{"auditor", "$JS.API.STREAM.PURGE." + events.StreamPrompts},
		{"author", "$KV.TEMPLATES.greet.label.production"},
		{"author", "$KV.BUILDERS.phi4mini.label.production"},
		{"author", events.EvaluationSubject(exec, "t1")},
		// No service changes a stream: that is the operator's (podium streams apply).
		{"composer", "$JS.API.STREAM.UPDATE." + events.StreamPrompts},
		{"composer", "$JS.API.STREAM.UPDATE." + events.StreamRounds},
		{"archiver", "$JS.API.STREAM.UPDATE." + events.StreamPrompts},
		{"ranker", "$JS.API.STREAM.UPDATE." + events.StreamEvaluations},
		{"ranker", "$JS.API.STREAM.UPDATE.KV_" + events.BucketScores},
		// Only the composer notes answered requests (one answer per request).
		{"orchestrator", "$KV." + events.BucketAnswered + "." + events.PromptEventID("sec-req")},
		{"console", "$KV." + events.BucketAnswered + "." + events.PromptEventID("sec-req")},
		{"author", "$KV." + events.BucketAnswered + "." + events.PromptEventID("sec-req")},
	} {
		refused(t, ns, c.role, c.subject)
	}

	for _, v := range []string{"V1", "V2"} {
		if out, code := e.podium(t, as("author"), "templates", "push", greetVersion(t, v)); code != 0 {
			t.Fatalf("the author's push of %s: exit %d\n%s", v, code, out)
		}
	}
	if out, code := e.podium(t, as("author"), "templates", "label", "greet", "2", "staging"); code != 0 {
		t.Errorf("the author's move of staging: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, as("author"), "templates", "label", "greet", "2", "production"); code != 1 || !strings.Contains(out, "not permitted") {
		t.Errorf("the author's move of production: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, as("release"), "templates", "label", "greet", "2", "production"); code != 0 {
		t.Errorf("the release user's move of production: exit %d\n%s", code, out)
	}
	// Builders: the same rule (docs/builders.md); the composer follows them under its user.
	module := writeModule(t, "phi4mini", testenv.BuildWasm(t, "../builders/phi4mini"))
	if out, code := e.podium(t, as("author"), "builders", "push", module, "--name", "phi4mini", "--models", "phi-4*"); code != 0 {
		t.Fatalf("the author's push of a builder: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, as("author"), "builders", "label", "phi4mini", "1", "production"); code != 1 || !strings.Contains(out, "not permitted") {
		t.Errorf("the author's move of a builder's production: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, as("release"), "builders", "label", "phi4mini", "1", "production"); code != 0 {
		t.Errorf("the release user's move of a builder's production: exit %d\n%s", code, out)
	}
	testenv.WaitFor(t, 10*time.Second, "the composer serving phi4mini@1", func() (bool, string) {
		return procs[1].metric(t, `composer_builders_served{name="phi4mini",version="1"}`) == 1, procs[1].logs.String()
	})
	e.requestRound("sec-phi", events.RoundRequested{ExecutionID: exec, TeamID: "t2", TeamName: "Team t2", RoundNumber: 2, UserPrompt: "Again.", Model: "phi-4-mini"}, t0.Add(time.Hour))
	if a := e.answers("prompt.*."+exec+".t2", 1, 30*time.Second)["sec-phi"]; !a.ok() || a.composed.Builder == nil || a.composed.Builder.Fallback {
		t.Errorf("a request of the builder's model under the shipped users: %s %+v %+v", a.subject, a.failed, a.composed.Builder)
	}
	// An author's rollup on a key it may write would empty the bucket, and one on a module store the
	// store: the buckets and stores refuse it, as they refuse the release role's.
	author, _ := connectAs(t, ns, "author")
	ajs, err := jetstream.New(author)
	if err != nil {
		t.Fatal(err)
	}
	release, _ := connectAs(t, ns, "release")
	rjs, err := jetstream.New(release)
	if err != nil {
		t.Fatal(err)
	}
	sha := strings.Repeat("0a", 32)
	for js, subjects := range map[jetstream.JetStream][]string{
		ajs: {"$KV.TEMPLATES.greet.v1", "$KV.BUILDERS.phi4mini.v1", "builders.modules." + sha},
		rjs: {"builders.modules." + sha, "builders.releases." + sha},
	} {
		for _, subject := range subjects {
			msg := &nats.Msg{Subject: subject, Data: []byte("{}"), Header: nats.Header{"Nats-Rollup": []string{"all"}}}
			if _, err := js.PublishMsg(t.Context(), msg); err == nil || !strings.Contains(err.Error(), "rollup") {
				t.Errorf("a rollup on %s as a user who may write it: %v, want it refused", subject, err)
			}
		}
	}
	if out, code := e.podium(t, as("auditor"), "templates", "list"); code != 0 || !strings.Contains(out, "greet") {
		t.Errorf("the registry after an author's rollup: exit %d\n%s", code, out)
	}

	// The services were refused nothing they asked.
	for _, p := range procs {
		if strings.Contains(p.logs.String(), "Permissions Violation") {
			t.Errorf("%s was refused something under its user:\n%s", p.name, p.logs)
		}
	}
	// Nothing above took a service's consumer or a stream away.
	for _, c := range [][2]string{{events.StreamEvaluations, events.ConsumerRanker}, {events.StreamRounds, events.ConsumerComposer}, {events.StreamPrompts, events.ConsumerArchiver}} {
		if _, err := consumerInfo(t.Context(), e.js, c[0], c[1]); err != nil {
			t.Errorf("consumer %s on %s: %v", c[1], c[0], err)
		}
	}
	t.Logf("deploy/: anonymous NATS refused, %d NATS roles and 5 ClickHouse users each doing its job and refused the rest", len(natsRoles))
}
