package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// trapWasm is a WASI command whose _start executes unreachable (the same bytes as
// internal/wasm's test).
var trapWasm = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x60, 0x00, 0x00, 0x03, 0x02, 0x01, 0x00,
	0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00, 0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b}

// writeModule writes a module to a file a push can name.
func writeModule(t testing.TB, name string, module []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".wasm")
	if err := os.WriteFile(path, module, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// composedFor reads the prompt.composed answer of one request.
func (e *env) composedFor(t *testing.T, execID, team string) events.PromptComposed {
	t.Helper()
	msgs := e.collect(events.StreamPrompts, events.PromptComposedSubject(execID, team), 1, 30*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("no prompt.composed for %s/%s", execID, team)
	}
	var out events.PromptComposed
	dataOf(t, msgs[0].Body, &out)
	return out
}

// TestPromptBuilders: the example builder, pushed and labelled production, builds the prompts of
// the models its globs match, recorded with its version and sha256, and verifies; pushed but not
// labelled it serves nothing; every hostile builder falls back to the template within the render
// deadline with its reason recorded and counted, and the composer goes on serving; podium.parse
// answers over NATS and through the CLI.
func TestPromptBuilders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer", "COMPOSER_RENDER_TIMEOUT=4s")

	const execution = "builders"
	e.publishEvaluation("b-e1", evaluation(execution, "t1", "One", 1, 0.4, "bubble sort", t0))
	e.publishEvaluation("b-e2", evaluation(execution, "t2", "Two", 1, 0.9, "merge sort", t0))
	request := func(team, name, model string, vars map[string]any) events.PromptComposed {
		t.Helper()
		e.requestRound("req-"+team, events.RoundRequested{ExecutionID: execution, TeamID: team, TeamName: name, RoundNumber: 2,
			UserPrompt: "Sort the list.", Model: model, Vars: vars}, t0.Add(time.Minute))
		return e.composedFor(t, execution, team)
	}

	phi := writeModule(t, "phi4mini", testenv.BuildWasmReactor(t, "../builders/phi4mini"))
	out, code := e.podium(t, nil, "builders", "push", phi, "--name", "phi4mini", "--models", "phi-4*", "--models", "microsoft/phi-4*", "--priority", "10")
	t.Logf("$ podium builders push phi4mini.wasm ...\n%s", out)
	if code != 0 || !strings.Contains(out, "pushed builder phi4mini@1") || !strings.Contains(out, "serves nothing until labelled production") {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "builders", "push", writeModule(t, "junk", []byte("not wasm")), "--name", "junk", "--models", "*"); code != 1 || !strings.Contains(out, "refused") {
		t.Fatalf("a module that does not load was not refused: exit %d\n%s", code, out)
	}

	// Pushed, not labelled: the template (its phi-4 variant) answers.
	before := request("t1", "One", "phi-4-mini", nil)
	if before.Builder != nil || before.Template.Variant != "phi-4" {
		t.Fatalf("an unlabelled builder served: builder %+v, variant %q", before.Builder, before.Template.Variant)
	}

	out, code = e.podium(t, nil, "builders", "list")
	t.Logf("$ podium builders list\n%s", out)
	if code != 0 || !strings.Contains(out, "phi4mini  1") || !strings.Contains(out, "its submissions and the evaluator's feedback") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "builders", "label", "phi4mini", "1", "production"); code != 0 {
		t.Fatalf("label: exit %d\n%s", code, out)
	}
	// The label reaches the composer: a render of the model is built.
	testenv.WaitFor(t, 10*time.Second, "the composer serving the labelled builder", func() (bool, string) {
		status, body := composer.render(t, map[string]any{"execution_id": execution, "team_id": "t9", "team_name": "Nine", "round_number": 1,
			"user_prompt": "Go.", "model": "phi-4-mini", "time": t0.Format(time.RFC3339)})
		return status == 200 && strings.Contains(string(body), `"builder":{"name":"phi4mini"`), fmt.Sprintf("%d %.300s", status, body)
	})

	tools := []any{map[string]any{"name": "run_tests", "description": "runs the tests"}}
	built := request("t2", "Two", "phi-4-mini", map[string]any{"tools": tools})
	if built.Builder == nil || built.Builder.Fallback || built.Builder.Name != "phi4mini" || built.Builder.Version != 1 || len(built.Builder.SHA256) != 64 {
		t.Fatalf("not built by phi4mini@1: %+v", built.Builder)
	}
	// The prompt, checked against what this test published: the team's own round, the board.
	for _, want := range []string{"<|system|>You are Two (team id t2)", `<|tool|>[{"description":"runs the tests","name":"run_tests"}]<|/tool|><|end|>`,
		"<|user|># Task\nSort the list.", "## Round 1: 0.90", "merge sort", "1. Two: best 0.90 in round 1 <- your team", "2. One: best 0.40 in round 1", "<|assistant|>"} {
		if !strings.Contains(built.Prompt, want) {
			t.Fatalf("the built prompt lacks %q:\n%s", want, built.Prompt)
		}
	}
	if strings.Contains(built.Prompt, "bubble sort") {
		t.Fatalf("team t2's prompt carries team t1's submission:\n%s", built.Prompt)
	}
	if built.Params["temperature"] != 0.2 || len(built.Messages) != 2 {
		t.Fatalf("params %v, messages %d", built.Params, len(built.Messages))
	}
	out, code = e.podium(t, nil, "prompts", "verify", execution, "t2", "2")
	t.Logf("$ podium prompts verify %s t2 2\n%s", execution, out)
	if code != 0 {
		t.Fatalf("verify of a built prompt: exit %d\n%s", code, out)
	}

	// The same builder in C (builders/phi4mini-c) as version 2: labelled production, it builds
	// the next request, which verifies; the record of version 1 (the Go reactor) still verifies
	// with version 1.
	// serve pushes module as phi4mini's next version and labels it production.
	serve := func(name string, module []byte, version int) {
		t.Helper()
		path := writeModule(t, "phi4mini-"+name, module)
		if out, code := e.podium(t, nil, "builders", "push", path, "--name", "phi4mini", "--models", "phi-4*", "--models", "microsoft/phi-4*", "--priority", "10"); code != 0 || !strings.Contains(out, fmt.Sprintf("pushed builder phi4mini@%d", version)) {
			t.Fatalf("push of the %s builder: exit %d\n%s", name, code, out)
		}
		if out, code := e.podium(t, nil, "builders", "label", "phi4mini", fmt.Sprint(version), "production"); code != 0 {
			t.Fatalf("label the %s builder: exit %d\n%s", name, code, out)
		}
		testenv.WaitFor(t, 10*time.Second, "the composer serving the "+name+" builder", func() (bool, string) {
			return composer.metric(t, fmt.Sprintf(`composer_builders_served{name="phi4mini",version="%d"}`, version)) == 1, ""
		})
	}
	serve("c", testenv.BuildC(t, "../builders/phi4mini-c"), 2)
	inC := request("t4", "Four", "phi-4-mini", map[string]any{"tools": tools})
	if inC.Builder == nil || inC.Builder.Fallback || inC.Builder.Version != 2 {
		t.Fatalf("not built by the C builder, phi4mini@2: %+v", inC.Builder)
	}
	for _, want := range []string{"<|system|>You are Four (team id t4)", `<|tool|>[{"description":"runs the tests","name":"run_tests"}]<|/tool|><|end|>`, "1. Two: best 0.90 in round 1\n", "<|assistant|>"} {
		if !strings.Contains(inC.Prompt, want) {
			t.Fatalf("the C builder's prompt lacks %q:\n%s", want, inC.Prompt)
		}
	}
	// And in Rust (builders/phi4mini-rs) as version 3, the same way.
	serve("rs", testenv.BuildRust(t, "../builders/phi4mini-rs"), 3)
	inRust := request("t5", "Five", "phi-4-mini", map[string]any{"tools": tools})
	if inRust.Builder == nil || inRust.Builder.Fallback || inRust.Builder.Version != 3 {
		t.Fatalf("not built by the Rust builder, phi4mini@3: %+v", inRust.Builder)
	}
	if want := strings.Replace(inC.Prompt, "You are Four (team id t4)", "You are Five (team id t5)", 1); inRust.Prompt != want {
		t.Fatalf("the Rust builder's prompt is not the C builder's for the same request:\n%s\nwant\n%s", inRust.Prompt, want)
	}
	for _, team := range []string{"t2", "t4", "t5"} {
		if out, code := e.podium(t, nil, "prompts", "verify", execution, team, "2"); code != 0 {
			t.Fatalf("verify of %s's prompt: exit %d\n%s", team, code, out)
		}
	}

	// Hostile builders: each serves its own model, and each falls back within the deadline.
	hostile := []struct{ kind, reason string }{
		{"trap", "builder trap: "}, {"loop", "builder timeout: "}, {"alloc", "builder memory: "},
		{"clock", "builder clock: "}, {"file", "builder exit: exit status 3: cannot read /etc/passwd"}, {"badjson", "builder invalid_output: "},
		{"load", "builder load: "},
	}
	for i, h := range hostile {
		var module []byte
		switch h.kind {
		case "trap":
			module = trapWasm
		case "load": // a module no composer holds yet, its released bytes lost
			// The trap module with a second (unused) function type: other bytes, as valid.
			module = slices.Concat(trapWasm[:8], []byte{0x01, 0x07, 0x02, 0x60, 0x00, 0x00, 0x60, 0x00, 0x00}, trapWasm[14:])
		default:
			module = testenv.BuildWasm(t, "../internal/wasm/testdata/"+h.kind)
		}
		name := "hostile-" + h.kind
		if out, code := e.podium(t, nil, "builders", "push", writeModule(t, name, module), "--name", name, "--models", name); code != 0 {
			t.Fatalf("push %s: exit %d\n%s", name, code, out)
		}
		if h.kind == "load" {
			// Other bytes appended under the pushed version's sha256 in the authors' store (what
			// any author may write): never read as the module; the label copies the real one.
			sum := fmt.Sprintf("%x", sha256.Sum256(module))
			forged := nats.NewMsg("builders.modules." + sum)
			forged.Data = []byte("changed under its name")
			forged.Header.Set("Podium-Module-Chunk", "0/1")
			forged.Header.Set("Podium-Module-Size", strconv.Itoa(len(module)))
			if _, err := e.js.PublishMsg(t.Context(), forged); err != nil {
				t.Fatal(err)
			}
			if out, code := e.podium(t, nil, "builders", "label", name, "1", "production"); code != 0 {
				t.Fatalf("label %s: exit %d\n%s", name, code, out)
			}
			if n := composer.metric(t, `composer_builder_builds_total{reason="timeout",result="fallback"}`); n < 1 {
				t.Fatalf("the timeout fallback is not counted: %v", n)
			}
			// The released bytes are lost on the store's side (a fault, not a role: nobody but the
			// operator can delete the stream, here made again from the authors' store but for this
			// module) while no composer holds them: a composer started now falls back.
			if _, err := composer.stop(t, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			loseRelease(t, e, name)
			composer = e.start("composer")
		} else if out, code := e.podium(t, nil, "builders", "label", name, "1", "production"); code != 0 {
			t.Fatalf("label %s: exit %d\n%s", name, code, out)
		}
		team := fmt.Sprintf("h%d", i)
		var got events.PromptComposed
		testenv.WaitFor(t, 10*time.Second, name+" served", func() (bool, string) {
			status, body := composer.render(t, map[string]any{"execution_id": execution, "team_id": "t9", "team_name": "Nine", "round_number": 1,
				"user_prompt": "Go.", "model": name, "time": t0.Format(time.RFC3339)})
			return status == 200 && strings.Contains(string(body), `"builder":{"name":"`+name), fmt.Sprintf("%d %.300s", status, body)
		})
		start := time.Now()
		got = request(team, "Hostile", name, nil)
		took := time.Since(start)
		if got.Builder == nil || !got.Builder.Fallback || got.Builder.Name != name || !strings.HasPrefix(got.Builder.Reason, h.reason[:strings.Index(h.reason, ":")+1]) || !strings.Contains(got.Builder.Reason, strings.TrimPrefix(h.reason, h.reason[:strings.Index(h.reason, ":")+2])) {
			t.Fatalf("%s: builder %+v, want a fallback with reason %q", name, got.Builder, h.reason)
		}
		if !strings.HasPrefix(got.Prompt, "You are Hostile (team id "+team+")") {
			t.Fatalf("%s: the fallback is not the template's prompt:\n%.300s", name, got.Prompt)
		}
		t.Logf("%s fell back in %s: %.160s", name, took.Round(time.Millisecond), got.Builder.Reason)
		if out, code := e.podium(t, nil, "prompts", "verify", execution, team, "2"); code != 0 {
			t.Fatalf("verify of %s's fallback: exit %d\n%s", name, code, out)
		}
	}
	// The console: what a builder sees, before and after labels; a prompt's builder, or its fallback.
	console := e.start("console")
	status, page := getPage(t, "http://"+console.addr+"/templates")
	if status != 200 || !strings.Contains(page, `id="builder-sees"`) || !strings.Contains(page, "its submissions and the evaluator&#39;s feedback") ||
		!strings.Contains(page, "<td>phi4mini</td>") || !strings.Contains(page, `<span class="label">production</span>`) {
		t.Fatalf("the console's builders: %d\n%s", status, page)
	}
	status, page = getPage(t, "http://"+console.addr+"/executions/"+execution+"/teams/t2/rounds/2?verify=1")
	if status != 200 || !strings.Contains(page, `id="builder">phi4mini@1`) || !strings.Contains(page, "built this prompt") || !strings.Contains(page, `class="verdict ok"`) {
		t.Fatalf("the console's page of a built prompt: %d\n%s", status, page)
	}
	status, page = getPage(t, "http://"+console.addr+"/executions/"+execution+"/teams/h1/rounds/2")
	if status != 200 || !strings.Contains(page, `id="builder-fallback"`) || !strings.Contains(page, "builder timeout") {
		t.Fatalf("the console's page of a fallback: %d\n%s", status, page)
	}
	// An author writes a labelled version's key again, to take every phi-4 model with the highest
	// priority: production still serves the version it named, from its copy, and the key is named.
	kv, err := e.js.KeyValue(t.Context(), "BUILDERS")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := kv.Get(t.Context(), "hostile-clock.v1")
	if err != nil {
		t.Fatal(err)
	}
	var taken map[string]any
	if err := json.Unmarshal(doc.Value(), &taken); err != nil {
		t.Fatal(err)
	}
	taken["models"], taken["priority"] = []string{"hostile-clock", "phi-4*"}, 99
	rewritten, _ := json.Marshal(taken)
	if _, err := kv.Put(t.Context(), "hostile-clock.v1", rewritten); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the rewrite named", func() (bool, string) {
		out, code := e.podium(t, nil, "builders", "list")
		return code == 0 && strings.Contains(out, "written again: served from its label's copy only"), out
	})
	started := e.start("composer")
	waitReadiness(t, started, 200, 60*time.Second) // ready once its builders are loaded
	for i, p := range []*proc{composer, started} { // one that saw the rewrite, one started after it
		status, body := p.render(t, map[string]any{"execution_id": execution, "team_id": "t9", "team_name": "Nine", "round_number": 1,
			"user_prompt": "Go.", "model": "hostile-clock", "time": t0.Format(time.RFC3339)})
		if status != 200 || !strings.Contains(string(body), `"builder":{"name":"hostile-clock"`) {
			out, _ := e.podium(t, nil, "builders", "list")
			t.Fatalf("after the rewrite, hostile-clock (composer %d): %d %s\n%s", i, status, body[max(0, len(body)-200):], out)
		}
		status, body = p.render(t, map[string]any{"execution_id": execution, "team_id": "t9", "team_name": "Nine", "round_number": 1,
			"user_prompt": "Go.", "model": "phi-4-mini", "time": t0.Format(time.RFC3339)})
		if status != 200 || !strings.Contains(string(body), `"builder":{"name":"phi4mini"`) {
			t.Fatalf("after the rewrite, phi-4-mini: %d %.300s", status, body)
		}
	}
	// Unharmed: still ready, and the example builder still builds.
	if code := composer.getJSON(t, "/readyz", nil); code != 200 {
		t.Fatalf("the composer is unready after the hostile builders: %d", code)
	}
	if again := request("t3", "Three", "phi-4-mini", nil); again.Builder == nil || again.Builder.Fallback {
		t.Fatalf("after the hostile builders: %+v", again.Builder)
	}

	// The execution's bundle carries the builders' modules (the Go reactor, C and Rust): its
	// records verify with no server.
	bundle := filepath.Join(t.TempDir(), "builders.podium.json.gz")
	out, code = e.podium(t, nil, "export", "--execution", execution, "--out", bundle)
	t.Logf("$ podium export --execution %s\n%s", execution, out)
	if code != 0 || !strings.Contains(out, "3 builder versions") {
		t.Fatalf("export: exit %d\n%s", code, out)
	}
	cmd := exec.Command(filepath.Join(bins.dir, "podium"), "prompts", "verify", "--bundle", bundle)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "NATS_URL=nats://127.0.0.1:1", "CLICKHOUSE_ADDR=127.0.0.1:1"} // no server
	offline, err := cmd.CombinedOutput()
	t.Logf("$ podium prompts verify --bundle (no servers)\n%s", offline)
	if err != nil || !strings.Contains(string(offline), "record(s) verified") {
		t.Fatalf("verify --bundle: %v\n%s", err, offline)
	}

	// Parse over NATS, and through the CLI.
	output := `Running them. <|tool_call|>[{"name":"run_tests","arguments":{"only":"sort"}}]<|/tool_call|> Done.<|end|>`
	body, _ := json.Marshal(map[string]string{"model": "phi-4-mini", "output": output})
	reply, err := e.nc.Request("podium.parse", body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		FinalAnswer  string `json:"final_answer"`
		ToolRequests []struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		} `json:"tool_requests"`
	}
	if err := json.Unmarshal(reply.Data, &parsed); err != nil || parsed.FinalAnswer != "Running them.  Done." || len(parsed.ToolRequests) != 1 ||
		parsed.ToolRequests[0].Name != "run_tests" || parsed.ToolRequests[0].Arguments["only"] != "sort" {
		t.Fatalf("podium.parse: %v %s", err, reply.Data)
	}
	body, _ = json.Marshal(map[string]string{"model": "gpt-9", "output": "x"})
	if reply, err := e.nc.Request("podium.parse", body, 10*time.Second); err != nil || reply.Header.Get("Nats-Service-Error-Code") != "404" {
		t.Fatalf("parse of a model no builder serves: %v %s", err, reply.Data)
	}
	cmd = exec.Command(filepath.Join(bins.dir, "podium"), "builders", "parse", "phi-4-mini")
	cmd.Env = e.baseEnv()
	cmd.Stdin = strings.NewReader(output)
	cli, err := cmd.CombinedOutput()
	t.Logf("$ podium builders parse phi-4-mini < output\n%s", cli)
	if err != nil || !strings.Contains(string(cli), `"final_answer":"Running them.  Done."`) {
		t.Fatalf("builders parse: %v\n%s", err, cli)
	}
}

// loseRelease deletes BUILDER_RELEASES and makes it again with the module of every version but
// those of lost: what an operator's partial restore leaves.
func loseRelease(t *testing.T, e *env, lost string) {
	t.Helper()
	ctx := t.Context()
	kv, err := e.js.KeyValue(ctx, builders.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := builders.Load(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	modules, err := builders.OpenStore(ctx, e.js, builders.ModulesConfig(1), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.js.DeleteStream(ctx, builders.Releases); err != nil {
		t.Fatal(err)
	}
	releases, err := builders.OpenStore(ctx, e.js, builders.ReleasesConfig(1), true)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range s.Versions {
		if v.Name == lost {
			continue
		}
		m, err := modules.Module(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if err := releases.Put(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}
