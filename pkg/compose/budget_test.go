package compose

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/pkg/events"
)

// longTournament is round 9 of a team with 8 evaluated rounds of long submissions, on a
// leaderboard of 12 teams where it is 5th.
func longTournament(template string, maxTokens int) Inputs {
	var hist []events.TeamRound
	for r := 1; r <= 8; r++ {
		hist = append(hist, tr(r, 50+float64(r)*3.25, fmt.Sprintf("round %d answer: ", r)+strings.Repeat("consensus needs a quorum; ", 60),
			fmt.Sprintf("feedback for round %d: be shorter", r),
			events.Metric{MetricName: "Clarity", Score: 60, EvaluatorComment: "ok"}, events.Metric{MetricName: "Depth", Score: 55.5, EvaluatorComment: "thin"}))
	}
	var board []events.LeaderboardRow
	previous := map[string]int{} // Alpha climbed from 7th to 5th, 6 and 7 fell, 12 is new
	for i := 1; i <= 12; i++ {
		team, name := fmt.Sprintf("team-%02d", i), fmt.Sprintf("Team %02d", i)
		if i == 5 {
			team, name = "team-alpha", "Alpha"
		}
		board = append(board, lb(i, i, team, name, 100-float64(i), 3, 8))
		switch {
		case i == 5:
			previous[team] = 7
		case i == 6 || i == 7:
			previous[team] = i - 1
		case i < 12:
			previous[team] = i
		}
	}
	req := request(9, template)
	req.MaxRounds = 10
	req.Limits.MaxPromptTokens = &maxTokens
	hr := 10
	req.Limits.HistoryRounds = &hr
	return Inputs{RequestID: "req-long", Request: req, Time: roundTime, History: hist, Leaderboard: board, PreviousRanks: previous, EvaluationsSeq: 96}
}

func TestBudgetCutsInOrderAndKeepsLevelOne(t *testing.T) {
	l := testLibrary(t)
	tmpl, err := l.Lookup("team-round")
	if err != nil {
		t.Fatal(err)
	}
	// Ground truth by linear scan: the tokens of every step of the cut sequence.
	in := longTournament("team-round", 0)
	lim := tmpl.limits(in.Request.Limits)
	steps := budgetSteps(in, lim, tmpl.contentFrom(in.History, lim))
	tokens := make([]int, len(steps))
	for i, c := range steps {
		r, err := l.render(context.Background(), "team-round", tmpl.parts, "", in, lim, time.UTC, c)
		if err != nil {
			t.Fatal(err)
		}
		tokens[i] = r.tokens
		if i > 0 && tokens[i] > tokens[i-1] {
			t.Errorf("step %d (%+v) grows the prompt: %d > %d tokens", i, c, tokens[i], tokens[i-1])
		}
	}
	last := tokens[len(tokens)-1]
	var levels []string // the sections in cut order, from the one table that defines it
	for _, s := range cutOrder() {
		levels = append(levels, s.section)
	}
	for max := tokens[0]; max >= last; max -= 37 {
		want := 0
		for tokens[want] > max {
			want++
		}
		out, err := l.Compose(context.Background(), longTournament("team-round", max))
		if err != nil {
			t.Fatalf("max %d: %v", max, err)
		}
		if diff := cmp.Diff(steps[want].truncations(in, lim), out.Truncated); diff != "" {
			t.Errorf("max %d: not the first step that fits (-want +got):\n%s", max, diff)
		}
		if out.TokenEstimate > max {
			t.Errorf("max %d: token_estimate %d is over it", max, out.TokenEstimate)
		}
		// Cuts come in docs/prompts.md's order: level 3 (oldest rounds first), then level 2.
		at := 0
		for _, c := range out.Truncated {
			for at < len(levels) && levels[at] != c.Section {
				at++
			}
			if at == len(levels) {
				t.Errorf("max %d: cuts out of order: %v", max, out.Truncated)
			}
		}
		// Level 1 survives every cut: the task, the team's position, its latest score.
		for _, must := range []string{"Write a haiku about distributed consensus.", "position 5 of 12", "Round 8: 76.00"} {
			if !strings.Contains(out.Prompt, must) {
				t.Errorf("max %d: prompt lost %q", max, must)
			}
		}
	}
	t.Logf("tokens by step: %v", tokens)
}

func TestBudgetGolden(t *testing.T) {
	l := testLibrary(t)
	for _, c := range []struct {
		template string
		max      int
	}{{"team-round", 700}, {"mixseek-team", 1500}} {
		out, err := l.Compose(context.Background(), longTournament(c.template, c.max))
		if err != nil {
			t.Fatal(err)
		}
		if out.TokenEstimate > c.max || len(out.Truncated) == 0 {
			t.Errorf("%s: %d tokens for a budget of %d, truncated %v", c.template, out.TokenEstimate, c.max, out.Truncated)
		}
		checkGolden(t, fmt.Sprintf("%s.round9-budget-%d", c.template, c.max), out.Prompt)
	}
}

func TestBudgetExceeded(t *testing.T) {
	l := testLibrary(t)
	_, err := l.Compose(context.Background(), longTournament("team-round", 50))
	if failureCode(err) != events.CodeBudgetExceeded || !strings.Contains(err.Error(), "max_prompt_tokens 50") {
		t.Fatalf("Compose with a 50-token budget: %v", err)
	}
}

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFolderTemplatesAreCheckedAtLoad(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"missing partial", map[string]string{"t/prompt.mustache": "a\n{{> nope}}\n"}, []string{`"t" line 2`, `partial "nope" not found`}},
		{"partial cycle", map[string]string{"t/prompt.mustache": "{{> a}}", "t/partials/a.mustache": "{{> b}}", "t/partials/b.mustache": "{{> a}}"}, []string{"includes itself", "a > b > a"}},
		{"unknown variable in a partial", map[string]string{"t/prompt.mustache": "{{> a}}", "t/partials/a.mustache": "{{team.nmae}}"}, []string{`unknown variable "team.nmae"`}},
		{"syntax error", map[string]string{"t/prompt.mustache": "{{#history}}"}, []string{`"t"`}},
		{"partial in a file template", map[string]string{"f.mustache": "{{> a}}"}, []string{"folder form"}},
		{"missing role file", map[string]string{"t/manifest.json": `{"roles": ["system", "user"]}`, "t/user.mustache": "{{user_prompt}}"}, []string{"system.mustache"}},
		{"bad role order", map[string]string{"t/manifest.json": `{"roles": ["user", "system"]}`}, []string{`must end with one "user"`}},
		{"unknown format", map[string]string{"t/manifest.json": `{"variants": [{"name": "x", "models": ["x*"], "format": "alpaca"}]}`, "t/prompt.mustache": "hi"}, []string{`format "alpaca"`}},
		{"unknown manifest field", map[string]string{"t/manifest.json": `{"verison": 2}`, "t/prompt.mustache": "hi"}, []string{"verison"}},
		{"bad variant file", map[string]string{"t/manifest.json": `{"variants": [{"name": "v", "models": ["m*"], "format": "chatml"}]}`,
			"t/prompt.mustache": "hi", "t/variants/v/prompt.mustache": "{{nope}}"}, []string{`"t/v"`, `unknown variable "nope"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(Options{Dir: writeTree(t, tt.files)})
			if err == nil {
				t.Fatal("Load accepted a bad template")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestVariantsAndFallback(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"t/manifest.json": `{"roles": ["system", "user"], "variants": [
			{"name": "low", "models": ["m-*"], "priority": 1, "format": "chatml"},
			{"name": "high", "models": ["m-1*"], "priority": 9, "format": "phi"},
			{"name": "broken", "models": ["b-*"], "format": "llama3"}]}`,
		"t/system.mustache":               "Sys {{team.name}}\n",
		"t/user.mustache":                 "Task: {{user_prompt}}\n",
		"t/variants/broken/user.mustache": "Needs {{vars.absent}}\n",
		"t/variants/high/system.mustache": "High sys\n",
	})
	l, err := Load(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		model, variant string
		fallback       bool
		prompt         string
	}{
		{"", "", false, "Sys Alpha\n\nTask: Write a haiku about distributed consensus."},
		{"m-2", "low", false, "<|im_start|>system\nSys Alpha<|im_end|>\n<|im_start|>user\nTask: Write a haiku about distributed consensus.<|im_end|>\n<|im_start|>assistant\n"},
		{"M-1-mini", "high", false, "<|system|>\nHigh sys<|end|>\n<|user|>\nTask: Write a haiku about distributed consensus.<|end|>\n<|assistant|>\n"},
		{"b-7", "broken", true, "Sys Alpha\n\nTask: Write a haiku about distributed consensus."},
		{"other", "", false, "Sys Alpha\n\nTask: Write a haiku about distributed consensus."},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			in := Inputs{RequestID: "r", Request: request(1, "t"), Time: roundTime}
			in.Request.Model = tt.model
			out, err := l.Compose(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			if out.Template.Variant != tt.variant || out.Template.Fallback != tt.fallback || out.Prompt != tt.prompt {
				t.Errorf("variant %q fallback %v prompt %q; want %q %v %q", out.Template.Variant, out.Template.Fallback, out.Prompt, tt.variant, tt.fallback, tt.prompt)
			}
			if len(out.Messages) != 2 || out.Messages[0].Role != "system" || out.Messages[1].Role != "user" {
				t.Errorf("messages = %+v", out.Messages)
			}
		})
	}
}

func TestRunnerTaskRejectsPathsOutsideTheWorkspace(t *testing.T) {
	l := testLibrary(t)
	base := runnerCases()["retry-digest"]
	tests := []struct {
		name string
		set  func(v map[string]any)
		want string
	}{
		{"absolute read_first", func(v map[string]any) { v["read_first"] = []any{"README.md", "/etc/passwd"} }, `vars.read_first[1] "/etc/passwd" is absolute`},
		{"climbing constraint", func(v map[string]any) {
			v["constraints"] = map[string]any{"write": []any{"src/../../secrets"}}
		}, `vars.constraints.write[0] "src/../../secrets" climbs out`},
		{"windows drive", func(v map[string]any) { v["read_first"] = []any{`C:\x`} }, "is absolute"},
		{"not a string", func(v map[string]any) { v["read_first"] = []any{json1()} }, "must be a path string, got a number"},
		{"digest path", func(v map[string]any) {
			v["digest"] = map[string]any{"exit_code": 1, "reason": "x", "changed_files": []any{"../up"}}
		}, `vars.digest.changed_files[0]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := base
			vars := map[string]any{}
			for k, v := range base.Request.Vars {
				vars[k] = v
			}
			tt.set(vars)
			in.Request.Vars = vars
			_, err := l.Compose(context.Background(), in)
			if failureCode(err) != events.CodeInvalidRequest || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Compose = %v, want invalid_request containing %q", err, tt.want)
			}
		})
	}
}

func json1() any { return float64(1) }

func TestTokenCounters(t *testing.T) {
	for _, tt := range []struct {
		encoding string
		text     string
		want     int
	}{
		{"o200k_base", "hello world", 2},
		{"cl100k_base", "hello world", 2},
		{"approx-cjk-v1", "hello world", 3},
		{"approx-cjk-v1", "日本語", 3},
	} {
		c, err := NewTokenCounter(tt.encoding)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.Count(context.Background(), tt.text); err != nil || got != tt.want || c.Name() != tt.encoding {
			t.Errorf("%s.Count(%q) = %d, want %d", tt.encoding, tt.text, got, tt.want)
		}
	}
	// Special-token text in a submission is text: it is never read as a control token.
	c, _ := NewTokenCounter("o200k_base")
	if n, _ := c.Count(context.Background(), "<|endoftext|>"); n < 3 {
		t.Errorf("<|endoftext|> counted as %d token(s): read as a special token", n)
	}
	if _, err := NewTokenCounter("gpt-9"); err == nil || !strings.Contains(err.Error(), "o200k_base") {
		t.Errorf("unknown encoding: %v", err)
	}
}

// TestBPECountIsExact checks that counting line by line (with the cache) gives what encoding
// the whole text at once gives, on every golden prompt and on text built to stress the cut
// points: newlines after punctuation, before slashes, runs of blank lines, CJK and spaces.
func TestBPECountIsExact(t *testing.T) {
	goldens, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no golden prompts: %v", err)
	}
	var texts []string
	for _, g := range goldens {
		b, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, string(b))
	}
	pieces := []string{"word", "Word", " ", "\n", "\n\n", ".", "/", "./x", "12345", "'s", "日本語", "　", "\t", "\r\n", "<|end|>", "é", "🚀", "{{x}}", "a.\n/b", ":\n-"}
	seed := uint64(42)
	for range 300 {
		var b strings.Builder
		for range 40 {
			seed = seed*6364136223846793005 + 1442695040888963407
			b.WriteString(pieces[seed>>33%uint64(len(pieces))])
		}
		texts = append(texts, b.String())
	}
	for _, enc := range []string{"o200k_base", "cl100k_base"} {
		c, err := NewTokenCounter(enc)
		if err != nil {
			t.Fatal(err)
		}
		whole := c.(*bpeCounter).enc
		for _, text := range texts {
			want, err := whole.Count(context.Background(), text)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // cold and cached
				if got, err := c.Count(context.Background(), text); err != nil || got != want {
					t.Fatalf("%s: Count = %d, whole-text encoding = %d, for %q", enc, got, want, text)
				}
			}
		}
	}
}

// TestPartialExpansionIsBounded: partials that each include the next twice grow 2^n; a template
// that expands to MaxExpandedBytes or less loads, one past it is refused at once with a clear
// error, however deep the doubling goes.
func TestPartialExpansionIsBounded(t *testing.T) {
	doubling := func(depth, leaf int) map[string]string {
		files := map[string]string{"t/prompt.mustache": "{{> p0}}", fmt.Sprintf("t/partials/p%d.mustache", depth): strings.Repeat("x", leaf)}
		for i := range depth {
			files[fmt.Sprintf("t/partials/p%d.mustache", i)] = fmt.Sprintf("{{> p%d}}{{> p%d}}", i+1, i+1)
		}
		return files
	}
	leaf := MaxExpandedBytes >> 10 // 1,024 bytes: ten doublings reach the bound exactly
	if _, err := Load(Options{Dir: writeTree(t, doubling(10, leaf))}); err != nil {
		t.Errorf("a template of exactly %d bytes after expansion: %v", MaxExpandedBytes, err)
	}
	for _, depth := range []int{11, 40} {
		_, err := Load(Options{Dir: writeTree(t, doubling(depth, leaf))})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("grows past %d bytes", MaxExpandedBytes)) {
			t.Errorf("depth %d (%d bytes expanded): %v", depth, leaf<<depth, err)
		}
	}
}

// TestTokenCacheKeepsNoPrompt: the counter's line cache holds copies of short lines only, so
// once a prompt is dropped, its memory can be freed whatever the cache kept of it.
func TestTokenCacheKeepsNoPrompt(t *testing.T) {
	tc, err := NewTokenCounter("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	c := tc.(*bpeCounter)
	prompt := strings.Repeat("a short line of the prompt\n", 1000) + strings.Repeat("y", 64<<10) + "\n"
	if _, err := c.Count(t.Context(), prompt); err != nil {
		t.Fatal(err)
	}
	start := unsafe.StringData(prompt)
	end := unsafe.Add(unsafe.Pointer(start), len(prompt))
	for k := range c.cache {
		if p := unsafe.Pointer(unsafe.StringData(k)); uintptr(p) >= uintptr(unsafe.Pointer(start)) && uintptr(p) < uintptr(end) {
			t.Fatalf("a cached line of %d bytes points into the prompt", len(k))
		}
		if len(k) > maxCachedLineBytes {
			t.Errorf("a line of %d bytes was cached", len(k))
		}
	}
	if len(c.cache) == 0 {
		t.Error("nothing was cached: the test shows nothing")
	}
}
