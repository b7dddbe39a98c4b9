package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats-server/v2/server"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// greetVersion writes a folder template whose two messages both carry its mark.
func greetVersion(t *testing.T, mark string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "greet")
	files := map[string]string{
		"manifest.json":   `{"roles": ["system", "user"]}`,
		"system.mustache": mark + " system for {{team.name}}\n",
		"user.mustache":   mark + " user: {{user_prompt}}\n",
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestTemplateRegistry: templates pushed with the CLI are served by every running composer; a
// label move reaches all three within a second, no render mixes two versions while labels move,
// a rollback is a label move, and a bad version is refused at push or, put into the bucket
// anyway, never served.
func TestTemplateRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composers := []*proc{e.start("composer"), e.start("composer"), e.start("composer")}

	bad := filepath.Join(t.TempDir(), "greet")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "prompt.mustache"), []byte("Hello\n{{team.nmae}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := e.podium(t, nil, "templates", "push", bad)
	t.Logf("$ podium templates push greet/   (a typo)\n%s", out)
	if code != 1 || !strings.Contains(out, `refused: compose: greet@1: template "greet" line 2: unknown variable "team.nmae"`) {
		t.Fatalf("push of a bad template: exit %d\n%s", code, out)
	}
	out, code = e.podium(t, nil, "templates", "push", greetVersion(t, "V1"), "--label", "production")
	t.Logf("$ podium templates push greet/ --label production\n%s", out)
	if code != 0 || !strings.Contains(out, "pushed greet@1") {
		t.Fatalf("push v1: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "templates", "push", greetVersion(t, "V2")); code != 0 || !strings.Contains(out, "pushed greet@2") {
		t.Fatalf("push v2: exit %d\n%s", code, out)
	}

	// render asks one composer for the bare name and returns the version and both messages' marks.
	render := func(p *proc) (int, []string) {
		status, body := p.render(t, map[string]any{"execution_id": "reg", "team_id": "t1", "team_name": "One", "round_number": 1,
			"user_prompt": "Go.", "template": "greet", "time": t0.Format(time.RFC3339)})
		var out events.PromptComposed
		if err := json.Unmarshal(body, &out); status != http.StatusOK || err != nil || len(out.Messages) != 2 {
			t.Fatalf("render: %d %s", status, body)
		}
		return out.Template.Version, []string{strings.Fields(out.Messages[0].Content)[0], strings.Fields(out.Messages[1].Content)[0]}
	}
	// servedWithin waits until every composer renders version want and returns how long it took.
	servedWithin := func(want int) time.Duration {
		start := time.Now()
		for _, p := range composers {
			for {
				if v, _ := render(p); v == want {
					break
				}
				if time.Since(start) > 5*time.Second {
					t.Fatalf("a composer still renders another version than %d after 5s", want)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		return time.Since(start)
	}
	servedWithin(1)
	if out, code := e.podium(t, nil, "templates", "label", "greet", "2", "production"); code != 0 {
		t.Fatalf("label: exit %d\n%s", code, out)
	}
	if took := servedWithin(2); took > time.Second {
		t.Errorf("the label move reached every composer after %s, want within 1s", took)
	} else {
		t.Logf("label move served by all three composers within %s", took.Round(time.Millisecond))
	}

	// Renders during label moves: each is one version from start to end.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mixed, total int
	var mu sync.Mutex
	for _, p := range composers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				v, marks := render(p)
				mu.Lock()
				total++
				if marks[0] != fmt.Sprintf("V%d", v) || marks[1] != marks[0] {
					mixed++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range 10 {
		if _, code := e.podium(t, nil, "templates", "label", "greet", fmt.Sprint(1+i%2), "production"); code != 0 {
			t.Fatal("label move failed")
		}
	}
	close(stop)
	wg.Wait()
	if mixed != 0 || total < 10 {
		t.Errorf("%d of %d renders during label moves mixed versions", mixed, total)
	}
	// Rollback: a label move back to 1.
	if _, code := e.podium(t, nil, "templates", "label", "greet", "1", "production"); code != 0 {
		t.Fatal("rollback failed")
	}
	servedWithin(1)

	// A prompt published with a registry version verifies: the auditor reads the registry too.
	e.requestRound("reg-published", events.RoundRequested{ExecutionID: "reg", TeamID: "t1", TeamName: "One", RoundNumber: 1, UserPrompt: "Go.", Template: "greet"}, t0)
	if a := e.answers("prompt.*.reg.t1", 1, 30*time.Second)["reg-published"]; !a.ok() || a.composed.Template.Name != "greet" || a.composed.Template.Version != 1 {
		t.Fatalf("published with the registry: %s %+v %+v", a.subject, a.failed, a.composed.Template)
	}
	if out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", "reg"); code != 0 || !strings.Contains(out, "(greet@1,") {
		t.Errorf("verify of a registry-rendered prompt: exit %d\n%s", code, out)
	}

	// A bad version put into the bucket behind the CLI's back is never served.
	kv, err := e.js.KeyValue(t.Context(), registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := registry.Encode(compose.Version{Name: "greet", Version: 3, Files: map[string][]byte{"prompt.mustache": []byte("{{#self}}x{{/self}}{{self.rank}}\n")}})
	if _, err := kv.Put(t.Context(), registry.VersionKey("greet", 3), doc); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), registry.LabelKey("greet", "staging"), []byte("3@"+registry.Digest(doc))); err != nil {
		t.Fatal(err)
	}
	for _, p := range composers {
		// Until the composer has seen the label, it answers as before it moved.
		testenv.WaitFor(t, 5*time.Second, "the bad version refused", func() (bool, string) {
			status, body := p.render(t, map[string]any{"execution_id": "reg", "team_id": "t1", "team_name": "One", "round_number": 1, "user_prompt": "Go.", "template": "greet:staging"})
			return status == http.StatusUnprocessableEntity && strings.Contains(string(body), `is labelled staging at version 3, which is not loaded`), fmt.Sprintf("%d %s", status, body)
		})
		waitMetric(t, p, "composer_template_versions_rejected_total", 1)
	}

	for _, args := range [][]string{{"templates", "list"}, {"templates", "history", "greet"}, {"templates", "diff", "greet@1", "greet@2"}} {
		out, _ := e.podium(t, nil, args...)
		t.Logf("$ podium %s\n%s", strings.Join(args, " "), out)
	}
	if out, code := e.podium(t, nil, "templates", "list"); code != 0 || !strings.Contains(out, "greet") || !strings.Contains(out, "production=1") || !strings.Contains(out, "latest=3") {
		t.Errorf("list: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "templates", "show", "greet@2"); code != 0 || !strings.Contains(out, "== system.mustache ==\nV2 system") {
		t.Errorf("show: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "templates", "diff", "greet@1", "greet@2"); code != 0 || !strings.Contains(out, "-V1 system for {{team.name}}") || !strings.Contains(out, "+V2 system for {{team.name}}") {
		t.Errorf("diff: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "templates", "history", "greet"); code != 0 || !strings.Contains(out, "pushed version 2") || strings.Count(out, "label production -> ") < 12 {
		t.Errorf("history: exit %d\n%s", code, out)
	}

	// mixseek-core's team template, imported from its prompt_builder.toml and served.
	toml := filepath.Join(t.TempDir(), "prompt_builder.toml")
	if err := os.WriteFile(toml, []byte("[prompt_builder]\nteam_user_prompt = \"\"\"\n現在日時: {{ current_datetime }}\n\n# タスク\n{{ user_prompt }}\n{% if round_number > 1 %}\n{{ ranking_table }}\n{% else %}\n初回のラウンドです。\n{% endif %}\n\"\"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := e.podium(t, nil, "templates", "import-mixseek", toml, "--push", "--name", "from-mixseek", "--label", "production"); code != 0 || !strings.Contains(out, "pushed from-mixseek@1") {
		t.Fatalf("import-mixseek: exit %d\n%s", code, out)
	}
	testenv.WaitFor(t, 5*time.Second, "the imported template served", func() (bool, string) {
		status, body := composers[0].render(t, map[string]any{"execution_id": "reg", "team_id": "t1", "team_name": "One", "round_number": 1, "user_prompt": "Go.", "template": "from-mixseek"})
		return status == http.StatusOK && strings.Contains(string(body), "初回のラウンドです。"), fmt.Sprintf("%d %s", status, body)
	})
	unsupported := filepath.Join(t.TempDir(), "prompt_builder.toml")
	if err := os.WriteFile(unsupported, []byte("[prompt_builder]\nteam_user_prompt = \"\"\"\nA\n{% for r in history %}{{ r }}{% endfor %}\n\"\"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := e.podium(t, nil, "templates", "import-mixseek", unsupported); code != 1 || !strings.Contains(out, `line 2: {% for r in history %} is not converted`) {
		t.Errorf("import of an unsupported construct: exit %d\n%s", code, out)
	}

	// Offline render of the folder being written, with a request and evaluations from files.
	dir := t.TempDir()
	reqFile, evFile := filepath.Join(dir, "req.json"), filepath.Join(dir, "evs.json")
	req, _ := json.Marshal(map[string]any{"execution_id": "off", "team_id": "t1", "team_name": "One", "round_number": 2, "user_prompt": "Again.", "time": t0.Format(time.RFC3339)})
	evs, _ := json.Marshal([]events.EvaluationCompleted{evaluation("off", "t1", "One", 1, 77, "first try", t0)})
	if err := os.WriteFile(reqFile, req, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(evFile, evs, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := e.podium(t, nil, "templates", "render", greetVersion(t, "LOCAL"), "--request", reqFile, "--evaluations", evFile); code != 0 ||
		!strings.Contains(out, "LOCAL system for One") || !strings.Contains(out, "LOCAL user: Again.") {
		t.Errorf("offline render: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "templates", "render", "mixseek-team", "--request", reqFile, "--evaluations", evFile); code != 0 ||
		!strings.Contains(out, "### スコア: 77.00/100") || !strings.Contains(out, "first try") {
		t.Errorf("offline render of a built-in template: exit %d\n%s", code, out)
	}
}

// TestTemplateRegistryDeletedTurnsTheComposerUnready: an operator deletes the TEMPLATES bucket
// under a running composer. The composer does not go on serving a registry it no longer follows
// as if nothing happened: once its watch ends it is unready naming the registry, and once the
// bucket exists again (made by a push) it follows it, serves what it holds, and is ready.
func TestTemplateRegistryDeletedTurnsTheComposerUnready(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	if out, code := e.podium(t, nil, "templates", "push", greetVersion(t, "V1"), "--label", "production"); code != 0 {
		t.Fatalf("push v1: exit %d\n%s", code, out)
	}
	if err := e.js.DeleteKeyValue(t.Context(), registry.Bucket); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitReadiness(t, composer, http.StatusServiceUnavailable, 30*time.Second)
	if _, body := readiness(composer); !strings.Contains(body, "template registry is not followed") {
		t.Errorf("readiness does not name the registry: %s", body)
	}
	unready := time.Since(deleted)
	if out, code := e.podium(t, nil, "templates", "push", greetVersion(t, "V9"), "--label", "production"); code != 0 {
		t.Fatalf("push after the delete: exit %d\n%s", code, out)
	}
	waitReadiness(t, composer, http.StatusOK, 30*time.Second)
	status, body := composer.render(t, map[string]any{"execution_id": "reg", "team_id": "t1", "team_name": "One", "round_number": 1,
		"user_prompt": "Go.", "template": "greet", "time": t0.Format(time.RFC3339)})
	if status != http.StatusOK || !strings.Contains(string(body), "V9 system") {
		t.Errorf("render after the registry came back: %d %.300s", status, body)
	}
	t.Logf("TEMPLATES deleted: composer unready %s later; ready again and serving the new push once the bucket was made again", unready.Round(time.Millisecond))
}

// TestOneRuleOfAReference: a name the registry holds versions of but no production label of is,
// bare, the built-in template of that name, for the composer and for `podium templates show`
// alike; NAME:latest is the registry's highest version; NAME@latest is refused everywhere.
func TestOneRuleOfAReference(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	dir := filepath.Join(t.TempDir(), "team-round")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prompt.mustache"), []byte("registry team-round for {{team.name}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := e.podium(t, nil, "templates", "push", dir); code != 0 || !strings.Contains(out, "pushed team-round@1") {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	render := func(ref string) (int, events.PromptComposed, string) {
		var pc events.PromptComposed
		var status int
		var body []byte
		testenv.WaitFor(t, 10*time.Second, "the composer follows the registry", func() (bool, string) {
			status, body = composer.render(t, map[string]any{"execution_id": "rule", "team_id": "t1", "team_name": "One", "round_number": 1,
				"user_prompt": "Go.", "template": ref})
			return ref != "team-round:latest" || status == http.StatusOK, fmt.Sprintf("%d %s", status, body)
		})
		_ = json.Unmarshal(body, &pc)
		return status, pc, string(body)
	}
	// Bare: the built-in version, in the prompt and in show.
	status, pc, body := render("team-round")
	if status != http.StatusOK || pc.Template.Version != 4 || strings.Contains(pc.Prompt, "registry team-round") {
		t.Fatalf("render team-round: %d %s", status, body)
	}
	out, code := e.podium(t, nil, "templates", "show", "team-round")
	if code != 0 || !strings.HasPrefix(out, "team-round@4\n") || strings.Contains(out, "registry team-round") {
		t.Errorf("show team-round: exit %d\n%.300s", code, out)
	}
	// :latest: the registry's highest, in both.
	if status, pc, body := render("team-round:latest"); status != http.StatusOK || pc.Template.Version != 1 || !strings.Contains(pc.Prompt, "registry team-round for One") {
		t.Errorf("render team-round:latest: %d %s", status, body)
	}
	if out, code := e.podium(t, nil, "templates", "show", "team-round:latest"); code != 0 || !strings.HasPrefix(out, "team-round@1\n") {
		t.Errorf("show team-round:latest: exit %d\n%s", code, out)
	}
	// @latest: refused by both.
	if status, _, body := render("team-round@latest"); status != http.StatusBadRequest && status != http.StatusUnprocessableEntity {
		t.Errorf("render team-round@latest: %d %s", status, body)
	}
	if out, code := e.podium(t, nil, "templates", "show", "team-round@latest"); code != 1 || !strings.Contains(out, "a version is a positive number") {
		t.Errorf("show team-round@latest: exit %d\n%s", code, out)
	}
}

// TestProductionLabelNeedsTheReleaseRole: with the NATS permissions docs/templates.md gives, an
// author pushes versions and moves any label but production; moving production is refused with a
// clear error from the CLI, and a release user moves it.
func TestProductionLabelNeedsTheReleaseRole(t *testing.T) {
	t.Parallel()
	ns, err := servers.StartNATS(t.TempDir(), func(o *server.Options) {
		author := &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$KV.TEMPLATES.*.label.production"}},
		}
		o.Users = []*server.User{
			{Username: "release", Password: "release-pw"},
			{Username: "author", Password: "author-pw", Permissions: author},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	addr, db := testenv.Database(t)
	e := &env{t: t, ns: ns, chAddr: addr, database: db}
	as := func(user string) []string { return []string{"NATS_USER=" + user, "NATS_PASSWORD=" + user + "-pw"} }

	for _, v := range []string{"V1", "V2"} {
		if out, code := e.podium(t, as("author"), "templates", "push", greetVersion(t, v)); code != 0 || !strings.Contains(out, "pushed greet@") {
			t.Fatalf("the author's push of %s: exit %d\n%s", v, code, out)
		}
	}
	if out, code := e.podium(t, as("author"), "templates", "label", "greet", "2", "staging"); code != 0 || !strings.Contains(out, "label staging of greet -> 2") {
		t.Errorf("the author's move of staging: exit %d\n%s", code, out)
	}
	out, code := e.podium(t, as("author"), "templates", "label", "greet", "2", "production")
	t.Logf("$ podium templates label greet 2 production   (as the author)\n%s", out)
	if code != 1 || !strings.Contains(out, "not permitted to move the production label") {
		t.Errorf("the author's move of production: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, as("release"), "templates", "label", "greet", "2", "production"); code != 0 || !strings.Contains(out, "label production of greet -> 2") {
		t.Errorf("the release user's move of production: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, as("author"), "templates", "list"); code != 0 || !strings.Contains(out, "production=2") || !strings.Contains(out, "staging=2") {
		t.Errorf("list: exit %d\n%s", code, out)
	}
}

// TestTemplatesTryIsADryRun: `podium templates try` renders an execution's recorded requests with
// a candidate version, each as of its own evaluations_seq, and publishes nothing: a shorter
// candidate shows fewer tokens for every request; a candidate whose budget no request fits shows
// every request failing with budget_exceeded; --last N takes the newest N records of any execution.
func TestTemplatesTryIsADryRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	const exec = "try"
	n := e.play(exec, 3, 3)
	short := filepath.Join(t.TempDir(), "team-round")
	tiny := filepath.Join(t.TempDir(), "team-round")
	for dir, files := range map[string]map[string]string{
		short: {"prompt.mustache": "Round {{round_number}} for {{team.name}}: improve.\n"},
		tiny: {"prompt.mustache": strings.Repeat("Every word of this long fixed text counts against the budget. ", 20) + "{{team.name}}\n",
			"manifest.json": `{"limits": {"max_prompt_tokens": 40}}`},
	} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, text := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, dir := range []string{short, tiny} {
		if out, code := e.podium(t, nil, "templates", "push", dir); code != 0 {
			t.Fatalf("push: exit %d\n%s", code, out)
		}
	}
	prompts := func() uint64 {
		st, err := e.js.Stream(t.Context(), events.StreamPrompts)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.Msgs
	}
	before := prompts()

	type result struct {
		Requests []struct {
			Round        int    `json:"round_number"`
			TokensBefore int    `json:"tokens_before"`
			TokensAfter  int    `json:"tokens_after"`
			Failure      string `json:"failure"`
			Candidate    struct {
				Version int `json:"version"`
			} `json:"candidate_template"`
		} `json:"requests"`
		Summary struct {
			Requests       int            `json:"requests"`
			Failures       int            `json:"failures"`
			FailuresByCode map[string]int `json:"failures_by_code"`
		} `json:"summary"`
	}
	try := func(args ...string) result {
		t.Helper()
		out, code := e.podium(t, nil, append([]string{"templates", "try"}, args...)...)
		var r result
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("try %v: exit %d\n%s", args, code, out)
		}
		return r
	}
	got := try("team-round@1", "--execution", exec, "--json")
	if got.Summary.Requests != n || got.Summary.Failures != 0 {
		t.Errorf("the short candidate: %+v", got.Summary)
	}
	for _, r := range got.Requests {
		if r.Candidate.Version != 1 || r.TokensAfter == 0 || r.TokensAfter >= r.TokensBefore {
			t.Errorf("round %d: %+v", r.Round, r)
		}
	}
	got = try("team-round@2", "--execution", exec, "--json")
	if got.Summary.Failures != n || got.Summary.FailuresByCode["budget_exceeded"] != n {
		t.Errorf("the candidate no request fits: %+v", got.Summary)
	}
	if got := try("team-round@1", "--last", "4", "--json"); got.Summary.Requests != 4 {
		t.Errorf("--last 4: %+v", got.Summary)
	}
	out, code := e.podium(t, nil, "templates", "try", "team-round@1", "--execution", exec, "--diff")
	t.Logf("$ podium templates try team-round@1 --execution %s --diff\n%.1500s", exec, out)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d requests: 0 would fail", n)) || !strings.Contains(out, "+Round 2 for Team team-0: improve.") {
		t.Errorf("try --diff: exit %d\n%s", code, out)
	}
	if after := prompts(); after != before {
		t.Errorf("PROMPTS holds %d records after the dry runs, %d before", after, before)
	}
}

// TestTemplatesCompare plays seeded tournaments through the pipeline. In "exp" the production
// label splits 50/50 between versions 1 and 2, each team keeps the version it was served, and a
// team on version 2 scores 8 more each round; in "aa" the same split with no effect; in "nr" the
// requests name the versions themselves (team by team), with the same effect. `podium templates
// compare --json` calls version 2 better in "exp" with its interval, p-value and what they stand on,
// finds nothing in "aa" (inconclusive; no difference within a margin of 8), and refuses a verdict
// in "nr": the versions were not randomized.
func TestTemplatesCompare(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	composer := e.start("composer")
	e.start("archiver")
	const teams, rounds = 10, 4
	for _, name := range []string{"exp", "aa", "nr"} {
		pushVersions(t, e, name, 2)
	}
	for _, name := range []string{"exp", "aa"} {
		if out, code := e.podium(t, nil, "templates", "label", name, "1=50", "2=50", "production"); code != 0 {
			t.Fatalf("label %s: exit %d\n%s", name, code, out)
		}
		testenv.WaitFor(t, 10*time.Second, "the composer serves the split of "+name, func() (bool, string) {
			status, body := composer.render(t, map[string]any{"execution_id": "probe", "team_id": "p", "team_name": "P", "round_number": 1, "user_prompt": "Go.", "template": name})
			return status == http.StatusOK && strings.Contains(string(body), `"label":"production"`), fmt.Sprintf("%d %.200s", status, body)
		})
	}
	// play runs a tournament: each round every team's request, then its evaluation, 8 more for a
	// team on version 2 where effect is set; ref names the template a team asks for.
	play := func(name string, effect float64, seed uint64, ref func(k int) string, execs ...string) {
		rng := rand.New(rand.NewPCG(seed, 3))
		base := map[string]float64{}
		for r := 1; r <= rounds; r++ {
			for _, exec := range execs {
				for k := range teams {
					team := fmt.Sprintf("team-%d", k)
					e.requestRound(fmt.Sprintf("req-%s-%s-%d", exec, team, r), events.RoundRequested{ExecutionID: exec, TeamID: team,
						TeamName: "Team " + team, RoundNumber: r, UserPrompt: "Go.", MaxRounds: rounds, Template: ref(k)},
						t0.Add(time.Duration(r)*time.Hour))
				}
			}
			for _, exec := range execs {
				got := e.answers("prompt.*."+exec+".*", teams*r, 30*time.Second)
				for k := range teams {
					team, id := fmt.Sprintf("team-%d", k), exec+"/"+fmt.Sprint(k)
					a := got[fmt.Sprintf("req-%s-%s-%d", exec, team, r)]
					if !a.ok() {
						t.Fatalf("%s round %d: %s %+v", id, r, a.subject, a.failed)
					}
					if _, ok := base[id]; !ok {
						base[id] = 50 + 10*rng.Float64()
					}
					score := base[id] + 2*rng.NormFloat64()
					if a.composed.Template.Version == 2 {
						score += effect
					}
					e.publishEvaluation(fmt.Sprintf("ev-%s-%s-%d", exec, team, r),
						evaluation(exec, team, "Team "+team, r, score, fmt.Sprintf("answer %d", r), t0.Add(time.Duration(r)*time.Hour+time.Minute)))
				}
			}
		}
	}
	bare := func(name string) func(int) string { return func(int) string { return name } }
	play("exp", 8, 11, bare("exp"), "exp-1", "exp-2")
	play("aa", 0, 12, bare("aa"), "aa-1", "aa-2")
	play("nr", 8, 13, func(k int) string { return fmt.Sprintf("nr@%d", 1+k%2) }, "nr-1", "nr-2")
	for _, exec := range []string{"exp-1", "exp-2", "aa-1", "aa-2", "nr-1", "nr-2"} {
		waitRanked(t, ranker, exec, teams*rounds)
	}

	type report struct {
		Order    string `json:"score_order"`
		Baseline int    `json:"baseline"`
		Versions []struct {
			Version    int         `json:"version"`
			Teams      int         `json:"teams"`
			Executions int         `json:"executions"`
			Prompts    int         `json:"prompts"`
			Failed     int         `json:"failed"`
			Estimate   *float64    `json:"estimate"`
			CI         *[2]float64 `json:"ci"`
		} `json:"versions"`
		Comparisons []struct {
			Version    int         `json:"version"`
			Baseline   int         `json:"baseline"`
			Difference *float64    `json:"difference"`
			CI         *[2]float64 `json:"ci"`
			PValue     *float64    `json:"p_value"`
			Executions int         `json:"executions"`
			Teams      int         `json:"teams"`
			Verdict    string      `json:"verdict"`
			Reason     string      `json:"reason"`
			Scope      string      `json:"scope"`
			// Each execution's own difference.
			ByExecution []struct {
				Execution string `json:"execution"`
				Teams     int    `json:"teams"`
			} `json:"by_execution"`
		} `json:"comparisons"`
	}
	compare := func(name string, args ...string) report {
		t.Helper()
		out, code := e.podium(t, nil, append([]string{"templates", "compare", name, "--json"}, args...)...)
		var rep report
		if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Versions) != 2 || len(rep.Comparisons) != 1 {
			t.Fatalf("compare %s: exit %d\n%s", name, code, out)
		}
		t.Logf("$ podium templates compare %s --json\n%s", name, out)
		return rep
	}
	exp := compare("exp")
	teamsOf := 0
	for _, v := range exp.Versions {
		teamsOf += v.Teams
		if v.Executions != 2 || v.Prompts != v.Teams*rounds || v.Failed != 0 || v.Estimate == nil || v.CI == nil {
			t.Errorf("exp version %d: %+v", v.Version, v)
		}
	}
	c := exp.Comparisons[0]
	if teamsOf != 2*teams || exp.Baseline != 1 || exp.Order != "desc" || c.Version != 2 || c.Baseline != 1 || c.Verdict != "better" ||
		c.CI == nil || c.CI[0] <= 0 || c.PValue == nil || *c.PValue >= 0.05 || c.Executions != 2 || c.Teams != 2*teams || *c.Difference < 5 || *c.Difference > 11 {
		t.Errorf("exp: the effect of 8 was not found: %+v", c)
	}
	if c := compare("aa").Comparisons[0]; c.Verdict != "inconclusive" || c.CI == nil || c.CI[0] > 0 || c.CI[1] < 0 {
		t.Errorf("aa: the A/A split, no margin given: %+v", c)
	}
	// With a margin the interval lies within, the A/A split is no difference; the effect of 8 is
	// still better.
	if c := compare("aa", "--margin", "8").Comparisons[0]; c.Verdict != "no difference" || !strings.Contains(c.Reason, "within the margin of ±8") {
		t.Errorf("aa --margin 8: %+v", c)
	}
	if c := compare("exp", "--margin", "8").Comparisons[0]; c.Verdict != "better" {
		t.Errorf("exp --margin 8: %+v", c)
	}
	// Two executions cannot say how much the effect varies between executions: the verdict holds
	// for these executions only, each execution's own difference given.
	if c := exp.Comparisons[0]; c.Scope != "these executions only" || len(c.ByExecution) != 2 || c.ByExecution[0].Execution != "exp-1" || c.ByExecution[0].Teams+c.ByExecution[1].Teams != 2*teams {
		t.Errorf("exp: the scope and each execution's difference: %+v", c)
	}
	if c := compare("nr").Comparisons[0]; c.Verdict != "not randomized" || c.CI != nil || c.PValue != nil || !strings.Contains(c.Reason, "no execution had teams randomized") {
		t.Errorf("nr: versions named by the requests: %+v", c)
	}
	// Executions named one by one, and the baseline named: version 1 measured against 2.
	if c := compare("exp", "--execution", "exp-1", "--execution", "exp-2", "--baseline", "2").Comparisons[0]; c.Version != 1 || c.Baseline != 2 || c.Verdict != "worse" {
		t.Errorf("exp against version 2: %+v", c)
	}
	out, code := e.podium(t, nil, "templates", "compare", "exp")
	t.Logf("$ podium templates compare exp\n%s", out)
	if code != 0 || !strings.Contains(out, "version 2 against 1: better: over 2 randomized executions (20 teams)") {
		t.Errorf("compare exp: exit %d\n%s", code, out)
	}

	// A time range: before anything was recorded, nothing; from long ago, everything.
	if out, code := e.podium(t, nil, "templates", "compare", "exp", "--until", "2000-01-01T00:00:00Z"); code != 1 || !strings.Contains(out, "no prompt of template exp is recorded") {
		t.Errorf("compare --until 2000: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "templates", "compare", "exp", "--since", "2000-01-01T00:00:00Z"); code != 0 || !strings.Contains(out, "version 2 against 1: better") {
		t.Errorf("compare --since 2000: exit %d\n%s", code, out)
	}

	// The console's page of the template: the versions side by side, the verdict with its reason,
	// and a dry run of version 1 on an execution's recorded requests.
	console := e.start("console")
	page, err := httpGet("http://" + console.addr + "/templates/exp")
	for _, want := range []string{`id="versions"`, `data-version="1"`, `data-version="2"`, `data-verdict="better"`, "version 2 against 1: better", "over 2 randomized executions (20 teams)",
		`data-scope="these executions only"`, `class="by-execution"`, `<a href="/executions/exp-1">exp-1</a>`} {
		if err != nil || !strings.Contains(page, want) {
			t.Errorf("the template page lacks %s (%v)", want, err)
		}
	}
	if page, err := httpGet("http://" + console.addr + "/templates/nr"); err != nil || !strings.Contains(page, `data-verdict="not randomized"`) {
		t.Errorf("the page of nr lacks its verdict (%v)", err)
	}
	tried := "/templates/exp?try=1&execution=exp-1"
	page, err = httpGet("http://" + console.addr + tried)
	if err != nil || !strings.Contains(page, `id="trials"`) || !strings.Contains(page, fmt.Sprintf("%d recorded request(s) of exp-1 rendered again with exp@1", teams*rounds)) {
		t.Errorf("the dry run on the page: %v\n%.3000s", err, page)
	}
	ctx := browser(t)
	navigate(t, ctx, "http://"+console.addr+tried)
	writeShot(t, ctx, screenshotDir(t), "template.png")
	// The experiment's section alone: the picture of docs/templates.md.
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	png, err := chromedp.Run(tctx, chromedp.Screenshot("#experiment"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(screenshotDir(t), "template-experiment.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// pushVersions pushes n versions of a one-file template name, each saying its version.
func pushVersions(t *testing.T, e *env, name string, n int) {
	t.Helper()
	for v := 1; v <= n; v++ {
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		text := fmt.Sprintf("%s version %d, round {{round_number}} for {{team.name}}.\n", name, v)
		if err := os.WriteFile(filepath.Join(dir, "prompt.mustache"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := e.podium(t, nil, "templates", "push", dir); code != 0 {
			t.Fatalf("push %s v%d: exit %d\n%s", name, v, code, out)
		}
	}
}

// TestWeightedLabelIsSticky: a production label split 50/50 serves each team the version its
// execution and team choose, on whichever of three composer replicas; the record says the label
// and the version; after the weights move to 10/90 every team keeps its version in later rounds,
// a new execution's teams follow the new weights, and every record verifies.
func TestWeightedLabelIsSticky(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composers := []*proc{e.start("composer"), e.start("composer"), e.start("composer")}
	pushVersions(t, e, "exp", 2)
	label := func(specs ...string) {
		t.Helper()
		if out, code := e.podium(t, nil, append(append([]string{"templates", "label", "exp"}, specs...), "production")...); code != 0 {
			t.Fatalf("label: exit %d\n%s", code, out)
		}
	}
	const teams = 12
	served := map[string]int{} // exec/team -> version
	round := func(exec string, r int, split compose.Split) {
		t.Helper()
		for k := range teams {
			team := fmt.Sprintf("team-%d", k)
			e.requestRound(fmt.Sprintf("req-%s-%s-%d", exec, team, r), events.RoundRequested{ExecutionID: exec, TeamID: team,
				TeamName: "Team " + team, RoundNumber: r, UserPrompt: "Go.", MaxRounds: 3, Template: "exp"}, t0.Add(time.Duration(r)*time.Hour))
		}
		got := e.answers("prompt.*."+exec+".*", teams*r, 30*time.Second)
		for k := range teams {
			team := fmt.Sprintf("team-%d", k)
			a := got[fmt.Sprintf("req-%s-%s-%d", exec, team, r)]
			if !a.ok() || a.composed.Template.Label != "production" || a.composed.Request.Data.Template != "exp" {
				t.Fatalf("%s %s round %d: %s %+v %+v", exec, team, r, a.subject, a.composed.Template, a.failed)
			}
			v, id := a.composed.Template.Version, exec+"/"+team
			if want, ok := served[id]; ok && v != want {
				t.Errorf("%s moved from version %d to %d in round %d", id, want, v, r)
			}
			if _, ok := served[id]; !ok {
				// A team's first version is the one its hash chooses against the weights of then.
				want, _ := compose.Choose(split, "exp", "production", compose.Assignment{ExecutionID: exec, TeamID: team})
				if v != want {
					t.Errorf("%s first served version %d, the split chooses %d", id, v, want)
				}
				served[id] = v
			}
		}
	}
	even := compose.Split{{Version: 1, Weight: 50}, {Version: 2, Weight: 50}}
	skewed := compose.Split{{Version: 1, Weight: 10}, {Version: 2, Weight: 90}}
	label("1=50", "2=50")
	// Every composer has the split before the first request: a render of a probe team says so.
	for _, p := range composers {
		testenv.WaitFor(t, 10*time.Second, "the composer serves the split", func() (bool, string) {
			status, body := p.render(t, map[string]any{"execution_id": "probe", "team_id": "p", "team_name": "P", "round_number": 1, "user_prompt": "Go.", "template": "exp"})
			return status == http.StatusOK && strings.Contains(string(body), `"label":"production"`), fmt.Sprintf("%d %.200s", status, body)
		})
	}
	round("split-1", 1, even)
	versions := map[int]int{}
	for _, v := range served {
		versions[v]++
	}
	if versions[1] == 0 || versions[2] == 0 {
		t.Errorf("a 50/50 split served %v", versions)
	}

	// The weights move; a probe team whose choice differs shows when each composer has them.
	label("1=10", "2=90")
	probe := ""
	for k := range 100 {
		a := compose.Assignment{ExecutionID: "probe-2", TeamID: fmt.Sprintf("p%d", k)}
		x, _ := compose.Choose(even, "exp", "production", a)
		y, _ := compose.Choose(skewed, "exp", "production", a)
		if x != y {
			probe = a.TeamID
			break
		}
	}
	want, _ := compose.Choose(skewed, "exp", "production", compose.Assignment{ExecutionID: "probe-2", TeamID: probe})
	for _, p := range composers {
		testenv.WaitFor(t, 10*time.Second, "the composer serves the new weights", func() (bool, string) {
			status, body := p.render(t, map[string]any{"execution_id": "probe-2", "team_id": probe, "team_name": "P", "round_number": 1, "user_prompt": "Go.", "template": "exp"})
			return status == http.StatusOK && strings.Contains(string(body), fmt.Sprintf(`"version":%d`, want)), fmt.Sprintf("%d %.200s", status, body)
		})
	}
	round("split-1", 2, skewed) // started teams keep their versions
	round("split-1", 3, skewed)
	round("split-2", 1, skewed) // new teams follow the new weights

	spread := 0
	for _, p := range composers {
		if p.metric(t, `composer_requests_total{code="",outcome="composed"}`) > 0 {
			spread++
		}
	}
	t.Logf("served %v; composers that answered: %d of 3", served, spread)
	for _, exec := range []string{"split-1", "split-2"} {
		if out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", exec); code != 0 {
			t.Errorf("verify %s: exit %d\n%s", exec, code, out)
		}
	}
	if out, code := e.podium(t, nil, "templates", "list"); code != 0 || !strings.Contains(out, "production=[1=10,2=90]") {
		t.Errorf("list: exit %d\n%s", code, out)
	}
	console := e.start("console")
	for _, path := range []string{"/templates", "/templates/exp"} {
		if page, err := httpGet("http://" + console.addr + path); err != nil || !strings.Contains(page, "production=[1=10,2=90]") {
			t.Errorf("the console's %s does not show the split: %v", path, err)
		}
	}
}
