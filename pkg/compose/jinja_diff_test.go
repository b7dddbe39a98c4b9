package compose

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
)

// TestJinjaDiff is the differential test of FromJinja (what `podium templates import-mixseek`
// converts with): a converted template must render byte for byte as mixseek-core renders the
// Jinja2 original, with jinja2.Environment(autoescape=False, undefined=StrictUndefined) and
// nothing else. So Jinja2's defaults hold: trim_blocks=False and lstrip_blocks=False (a line that
// holds only a block tag keeps its indentation and its newline) and keep_trailing_newline=False
// (the template's one final newline is dropped); and Jinja2 writes every newline of the template
// text as "\n".
//
// Real Jinja2 renders the expected bytes: python3 runs once with every case. The templates are
// generated from a fixed seed, of exactly the subset FromJinja accepts, plus mixseek's default
// team template (mixseekDefault). Three groups are compared:
//
//   - default: mixseekDefault with the synthetic values below;
//   - generated: several hundred generated templates with the synthetic values;
//   - pipeline: every template through Library.Compose from a registry version, as a pushed
//     template is rendered, with the values the composer computes (Jinja2 gets those same values).
//
// The test is skipped only when no python3 with a jinja2 module is found.
func TestJinjaDiff(t *testing.T) {
	python := jdPython()
	if python == "" {
		t.Skip("no python3 with jinja2: apt-get install python3-jinja2")
	}
	t.Logf("Jinja2 of %s", python)

	var (
		synth    []jdCase // default and generated: the converted template rendered with given values
		pipeline []jdCase // through Library.Compose
	)
	r := rand.New(rand.NewPCG(20261121, 0x6d69787365656b))
	templates := []string{mixseekDefault}
	templates = append(templates, jdTemplates(r, 500)...)

	// Every template is converted and loaded exactly as import-mixseek does (FromJinja, then
	// LoadVersion), and pushed into one registry for the pipeline group.
	type converted struct {
		src, mustache string
		tmpl          *Template
		err           error // conversion or load refused it
		version       int   // in the registry; 0 when refused
	}
	conv := make([]converted, len(templates))
	var versions []Version
	for i, src := range templates {
		c := converted{src: src}
		c.mustache, c.err = FromJinja(src)
		if c.err == nil {
			c.tmpl, c.err = LoadVersion(Version{Name: "jinja-diff", Version: i + 1, Files: map[string][]byte{"prompt.mustache": []byte(c.mustache)}})
		}
		if c.err == nil {
			c.version = i + 1
			versions = append(versions, Version{Name: "jinja-diff", Version: i + 1, Files: map[string][]byte{"prompt.mustache": []byte(c.mustache)}})
		}
		conv[i] = c
	}
	probe := Version{Name: "jinja-diff-probe", Version: 1, Files: map[string][]byte{"prompt.mustache": []byte("{{user_prompt}}")}}
	lib, errs := testLibrary(t).WithRegistry(append(versions, probe), nil)
	if len(errs) > 0 {
		t.Fatalf("registry versions that LoadVersion accepted were refused: %v", errs)
	}

	for i, c := range conv {
		group := "generated"
		if i == 0 {
			group = "default"
		}
		for j := range 4 {
			vals := jdValues(r, j)
			k := jdCase{group: group, src: c.src, mustache: c.mustache, vars: vals, err: c.err, crlfOnly: jdCRLFOnly(c.src, c.err)}
			if c.err == nil {
				k.podium, k.err = jdRender(c.tmpl, vals)
			}
			synth = append(synth, k)
		}
	}

	fixtures := jdFixtures()
	for i, c := range conv {
		fixture := fixtures[i%len(fixtures)]
		if i == 0 {
			for _, f := range fixtures {
				pipeline = append(pipeline, jdCompose(t, lib, c.src, c.mustache, c.version, c.err, f))
			}
			continue
		}
		pipeline = append(pipeline, jdCompose(t, lib, c.src, c.mustache, c.version, c.err, fixture))
	}

	all := append(append([]jdCase(nil), synth...), pipeline...)
	outs, skip := jdJinja(t, python, all)
	if skip != "" {
		t.Skip(skip)
	}
	for i := range all {
		all[i].jinja, all[i].jinjaErr = outs[i].Out, outs[i].Error
	}
	synth, pipeline = all[:len(synth)], all[len(synth):]

	byGroup := map[string][]jdCase{}
	for _, c := range synth {
		byGroup[c.group] = append(byGroup[c.group], c)
	}
	for _, c := range pipeline {
		c.group = "pipeline"
		byGroup["pipeline"] = append(byGroup["pipeline"], c)
	}
	for _, group := range []string{"default", "generated", "pipeline"} {
		t.Run(group, func(t *testing.T) { jdCompare(t, byGroup[group]) })
	}
}

// jdCase is one template rendered with one set of values by Jinja2 and by Podium.
type jdCase struct {
	group    string
	src      string         // the Jinja2 template
	mustache string         // what FromJinja made of it
	vars     map[string]any // mixseek's variables, as Jinja2 gets them
	podium   string
	err      error // FromJinja, LoadVersion or the render refused or failed
	crlfOnly bool  // refused only because of its CRLF line ends (the LF form is accepted)

	jinja, jinjaErr string
}

// jdCompare reports how many cases differ and, for each kind of template that fails (jdKind),
// the shortest failing one: its template, what FromJinja made of it, the values and both outputs.
func jdCompare(t *testing.T, cases []jdCase) {
	type failure struct {
		c       jdCase
		problem string
	}
	shortest := map[string]failure{}
	count := map[string]int{}
	failed, refusedCRLF := 0, 0
	templates, failedTemplates := map[string]bool{}, map[string]bool{}
	for _, c := range cases {
		templates[c.src] = true
		var problem string
		switch {
		case c.jinjaErr != "":
			problem = "Jinja2 fails (the generator made a template outside the subset): " + c.jinjaErr
		case c.err != nil && c.crlfOnly:
			// Refusing CRLF line ends outright is a correct conversion too: it never renders
			// differently. Accepting them commits to rendering as Jinja2 does ("\n").
			refusedCRLF++
			continue
		case c.err != nil:
			problem = "Podium fails: " + c.err.Error()
		case c.podium != c.jinja:
			problem = "outputs differ"
		default:
			continue
		}
		failed++
		failedTemplates[c.src] = true
		kind := jdKind(c)
		count[kind]++
		if f, ok := shortest[kind]; !ok || len(c.src) < len(f.c.src) {
			shortest[kind] = failure{c, problem}
		}
	}
	if refusedCRLF > 0 {
		t.Logf("%d case(s) refused by FromJinja only for their CRLF line ends", refusedCRLF)
	}
	if failed == 0 {
		t.Logf("%d case(s) of %d template(s) render byte for byte as Jinja2", len(cases), len(templates))
		return
	}
	var kinds []string
	for _, kind := range jdKinds {
		f, ok := shortest[kind]
		if !ok {
			continue
		}
		kinds = append(kinds, fmt.Sprintf("%s: %d", kind, count[kind]))
		vars, _ := json.Marshal(f.c.vars)
		t.Errorf("%s [%s, the shortest of %d failing case(s) of this kind]\ntemplate: %q\nmustache: %q\nvalues:   %s\n%s",
			f.problem, kind, count[kind], f.c.src, f.c.mustache, jdClip(string(vars)), jdOutputs(f.c.jinja, f.c.podium))
	}
	t.Errorf("%d of %d case(s) render differently from Jinja2, of %d of %d template(s) (%s)",
		failed, len(cases), len(failedTemplates), len(templates), strings.Join(kinds, ", "))
}

// jdKinds are the kinds of failing case, in the order jdKind tries them: a label for reading
// the report (what the template has that Jinja2 and Mustache treat differently), not a diagnosis.
var jdKinds = []string{
	"only the final newline differs",
	"CRLF line ends",
	"a block tag alone on its line",
	"a block tag line indented",
	"a block tag line with blanks after the tag",
	"other",
}

var (
	jdLoneTag     = regexp.MustCompile(`(?m)^\{%[^%]*%\}$`)
	jdIndentedTag = regexp.MustCompile(`(?m)^[ \t]+\{%[^%]*%\}[ \t]*$`)
	jdTrailingTag = regexp.MustCompile(`(?m)^\{%[^%]*%\}[ \t]+$`)
)

func jdKind(c jdCase) string {
	switch {
	case c.err == nil && (c.podium == c.jinja+"\n" || c.podium == c.jinja+"\r\n"):
		return jdKinds[0]
	case strings.Contains(c.src, "\r\n"):
		return jdKinds[1]
	case jdLoneTag.MatchString(c.src):
		return jdKinds[2]
	case jdIndentedTag.MatchString(c.src):
		return jdKinds[3]
	case jdTrailingTag.MatchString(c.src):
		return jdKinds[4]
	}
	return jdKinds[5]
}

// jdOutputs quotes both outputs whole when they are short, else around their first difference.
func jdOutputs(jinja, podium string) string {
	at := 0
	for at < len(jinja) && at < len(podium) && jinja[at] == podium[at] {
		at++
	}
	if len(jinja)+len(podium) <= 3000 {
		return fmt.Sprintf("jinja2:   %q\npodium:   %q\n(first difference at byte %d)", jinja, podium, at)
	}
	from := max(0, at-300)
	around := func(s string) string { return s[from:min(len(s), at+300)] }
	return fmt.Sprintf("outputs of %d and %d bytes; first difference at byte %d; around it (from byte %d):\njinja2:   %q\npodium:   %q",
		len(jinja), len(podium), at, from, around(jinja), around(podium))
}

// jdClip shortens a long value listing (the pipeline's histories) for a failure message.
func jdClip(s string) string {
	if len(s) <= 2000 {
		return s
	}
	return s[:2000] + fmt.Sprintf("... (%d bytes in all)", len(s))
}

// jdRender renders a loaded template with the values vars, as Compose renders it:
// Library.render calls p.tmpl.Render(vals) on the part LoadVersion parsed (mustache, raw, no
// HTML escaping) with vals a map[string]any, and a template of one role-less part without a
// format is the prompt unchanged (no newline trimmed). vals holds mixseek's names with the Go
// types buildContext gives them (strings; round_number an int) and is_first_round, which
// requestValues derives from round_number and the converted {% if round_number > 1 %} tests.
// Only the computing of the values is skipped, so they can be anything mixseek could pass; the
// pipeline group covers that computing with real inputs.
func jdRender(tmpl *Template, vars map[string]any) (string, error) {
	if len(tmpl.parts) != 1 || tmpl.parts[0].role != "" {
		return "", fmt.Errorf("loaded as %d part(s), want one role-less prompt", len(tmpl.parts))
	}
	vals := map[string]any{"is_first_round": vars["round_number"].(int) == 1}
	for k, v := range vars {
		vals[k] = v
	}
	return tmpl.parts[0].tmpl.Render(vals)
}

// jdCompose renders registry version v of "jinja-diff" through Library.Compose for in, and takes
// the values Jinja2 gets from the context Compose renders with (budget off: the uncut context).
func jdCompose(t *testing.T, lib *Library, src, mustache string, v int, convErr error, in Inputs) jdCase {
	t.Helper()
	c := jdCase{src: src, mustache: mustache, err: convErr, crlfOnly: jdCRLFOnly(src, convErr)}
	// The values do not depend on the template (none has a manifest, so all have the default
	// limits): a refused one gets those of the probe, which is always loaded.
	in.Request.Template = "jinja-diff-probe"
	if v > 0 {
		in.Request.Template = fmt.Sprintf("jinja-diff@%d", v)
	}
	tmpl, err := lib.Lookup(in.Request.Template)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := lib.location(in.Request.Timezone)
	if err != nil {
		t.Fatal(err)
	}
	lim := tmpl.limits(in.Request.Limits)
	if lim.MaxPromptTokens != 0 {
		t.Fatalf("fixture with max_prompt_tokens %d: the budget would cut the values", lim.MaxPromptTokens)
	}
	ctx := buildContext(in, lim, loc, cuts{}, func(string) bool { return true })
	c.vars = map[string]any{}
	for _, name := range jdNames {
		c.vars[name] = ctx[name]
	}
	if v == 0 {
		return c
	}
	out, err := lib.Compose(context.Background(), in)
	c.podium, c.err = out.Prompt, err
	return c
}

// jdCRLFOnly reports whether a refused template has CRLF line ends and is accepted with LF ones.
func jdCRLFOnly(src string, err error) bool {
	if err == nil || !strings.Contains(src, "\r\n") {
		return false
	}
	text, err := FromJinja(strings.ReplaceAll(src, "\r\n", "\n"))
	if err == nil {
		_, err = LoadVersion(Version{Name: "jinja-diff", Version: 1, Files: map[string][]byte{"prompt.mustache": []byte(text)}})
	}
	return err == nil
}

// jdNames are the variables mixseek-core passes its team template.
var jdNames = []string{"current_datetime", "user_prompt", "round_number", "ranking_table", "team_position_message", "submission_history"}

// jdScript renders each {template, vars} of a JSON list on stdin with mixseek-core's environment
// and writes the list of {out} or {error}. Exit 77: no jinja2 module.
const jdScript = `
import json, sys
try:
    import jinja2
except ImportError:
    sys.exit(77)
results = []
for case in json.loads(sys.stdin.buffer.read()):
    try:
        out = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined).from_string(case["template"]).render(**case["vars"])
        results.append({"out": out})
    except Exception as e:
        results.append({"error": "%s: %s" % (type(e).__name__, e)})
sys.stdout.buffer.write(json.dumps(results).encode("ascii"))
`

type jdOutput struct {
	Out   string `json:"out"`
	Error string `json:"error"`
}

// jdPython is the first python3 that imports jinja2: Debian's (where python3-jinja2 installs it)
// before one on PATH, which may be a pyenv interpreter without it.
func jdPython() string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import jinja2").Run() == nil {
			return p
		}
	}
	return ""
}

// jdJinja renders every case with Jinja2 in one python3 run; skip is set when jinja2 is missing.
func jdJinja(t *testing.T, python string, cases []jdCase) (outs []jdOutput, skip string) {
	t.Helper()
	type input struct {
		Template string         `json:"template"`
		Vars     map[string]any `json:"vars"`
	}
	in := make([]input, len(cases))
	for i, c := range cases {
		in[i] = input{c.src, c.vars}
	}
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-c", jdScript)
	cmd.Stdin = bytes.NewReader(body)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == 77 {
		return nil, "python3's jinja2 module is missing: apt-get install python3-jinja2"
	}
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(stdout, &outs); err != nil || len(outs) != len(cases) {
		t.Fatalf("python3 answered %d result(s) for %d case(s): %v", len(outs), len(cases), err)
	}
	return outs, ""
}

// The synthetic values: empty, multi-line, CJK, Jinja2 and Mustache syntax, HTML specials,
// padding, CRLF. Jinja2 never renders its output again and Podium's mustache is raw, so all of
// them must come out as they are.
var jdStrings = []string{
	"",
	"plain",
	"multi-line\ntext\nwith a final newline\n",
	"two\nlines",
	"\n",
	"日本語のテキストと中文、한국어",
	"{{ user_prompt }} {% if ranking_table %} }} %} {{#x}}{{/x}} {{{y}}}",
	`<&>"'`,
	"  padded  ",
	"crlf\r\nvalue",
	"\tindented\n\tlines\n",
}

// jdRankingTables are the non-empty ranking_table values. Not whitespace-only ones: Jinja2 finds
// "\n" true and mustache finds it empty, but the composer's ranking_table is never blank (it is
// the table or the no-ranking sentence), and mixseek's is "" or a table.
var jdRankingTables = []string{
	"1位 team-beta (<Beta & Co>) 80.0\n2位 team-alpha (あなたのチーム) 61.5",
	"one row }} {{ x }}",
	"ends with a newline\n",
	`<&>"'`,
	"日本語",
}

// jdValues is the j-th of a template's four value sets; j picks round_number and whether
// ranking_table is empty so that every template meets the four combinations.
func jdValues(r *rand.Rand, j int) map[string]any {
	pick := func(from []string) string { return from[r.IntN(len(from))] }
	vals := map[string]any{}
	for _, name := range jdNames {
		vals[name] = pick(jdStrings)
	}
	vals["round_number"] = []int{1, 2, 1, 7}[j]
	vals["ranking_table"] = ""
	if j == 1 || j == 2 {
		vals["ranking_table"] = pick(jdRankingTables)
	}
	return vals
}

// jdFixtures are the composer inputs of the pipeline group, budget off so the values are whole.
func jdFixtures() []Inputs {
	none := 0
	mk := func(round int, prompt string, hist []events.TeamRound, board []events.LeaderboardRow) Inputs {
		req := request(round, "jinja-diff")
		req.MaxRounds = 10
		req.UserPrompt = prompt
		req.Limits.MaxPromptTokens = &none
		return Inputs{RequestID: "req-jinja-diff", Request: req, Time: roundTime, History: hist, Leaderboard: board, EvaluationsSeq: 3}
	}
	odd := "answer: {{ user_prompt }} {% if ranking_table %} }} <&>\"'\n二行目\n"
	return []Inputs{
		mk(1, "複数行の\nタスク\n", nil, nil),
		mk(2, `Write <code> & "quote" it`,
			[]events.TeamRound{tr(1, 61.5, odd, "feedback }} 改善して", events.Metric{MetricName: "Clarity", Score: 60, EvaluatorComment: "<ok>"})},
			[]events.LeaderboardRow{lb(1, 1, "team-beta", "<Beta & Co>", 80, 1, 1), lb(2, 2, "team-alpha", `Alpha "A"`, 61.5, 1, 1)}),
		mk(3, "",
			[]events.TeamRound{tr(1, 40, "first\n", "more"), tr(2, 45.25, odd, "")},
			[]events.LeaderboardRow{lb(1, 1, "team-beta", "Beta", 90, 2, 2), lb(2, 2, "team-gamma", "ガンマ", 70, 1, 2)}),
		longTournament("jinja-diff", 0),
	}
}

// jdTemplates generates n distinct templates of the subset FromJinja accepts.
func jdTemplates(r *rand.Rand, n int) []string {
	seen := map[string]bool{mixseekDefault: true}
	var out []string
	for len(out) < n {
		g := &jdGen{r: r}
		src := g.template(len(out))
		if strings.TrimSpace(src) == "" || seen[src] {
			continue
		}
		seen[src] = true
		out = append(out, src)
	}
	return out
}

// jdGen writes one template: text lines, empty lines, {{ var }} interpolations and if blocks
// (else branches, nesting, empty bodies), each block tag alone on its line (indented with spaces
// or tabs or not, trailing blanks or not), inline in text, or indented with more on its line.
type jdGen struct {
	r *rand.Rand
	b strings.Builder
}

func (g *jdGen) pick(from ...string) string { return from[g.r.IntN(len(from))] }

func (g *jdGen) atLineStart() bool {
	s := g.b.String()
	return s == "" || s[len(s)-1] == '\n'
}

func (g *jdGen) template(i int) string {
	n := 1 + g.r.IntN(6)
	if i%5 == 0 { // a block at the very start
		g.block(0)
		n--
	}
	g.items(0, n)
	if i%4 == 0 { // a block at the very end
		g.block(0)
	}
	src := g.b.String()
	switch k := g.r.IntN(20); {
	case k < 8: // exactly one final newline, as a TOML multi-line string ends
		src = strings.TrimRight(src, "\n") + "\n"
	case k < 14: // none
		src = strings.TrimRight(src, "\n")
	case k < 17: // as generated
	default: // an empty last line too
		src = strings.TrimRight(src, "\n") + "\n\n"
	}
	if g.r.IntN(8) == 0 {
		src = strings.ReplaceAll(src, "\n", "\r\n")
	}
	return src
}

func (g *jdGen) items(depth, n int) {
	for range n {
		g.item(depth)
	}
}

func (g *jdGen) item(depth int) {
	switch k := g.r.IntN(10); {
	case k < 2 || k >= 6 && depth >= 3:
		g.b.WriteString(g.pick("本文", "# 見出し", "plain text", "  indented text", "\ttabbed", "a }} b %} c", `<&>"'`, "trailing blanks  ", "x > 1") + "\n")
	case k < 3:
		g.b.WriteString("\n")
	case k < 6:
		g.b.WriteString(g.pick("", "", "", "ラウンド ", "  ", "\t", "- ", "<"))
		g.variable()
		g.b.WriteString(g.pick("", "", " 後", " ", ">", " }} "))
		if g.r.IntN(5) > 0 {
			g.b.WriteString("\n")
		}
	default:
		g.block(depth)
	}
}

func (g *jdGen) variable() {
	name := jdNames[g.r.IntN(len(jdNames))]
	g.b.WriteString(strings.Replace(g.pick("{{ _ }}", "{{ _ }}", "{{_}}", "{{  _  }}", "{{\t_ }}"), "_", name, 1))
}

func (g *jdGen) block(depth int) {
	cond := g.pick("round_number > 1", "ranking_table")
	g.tag("if " + cond)
	g.items(depth+1, g.r.IntN(4))
	if g.r.IntN(3) == 0 {
		g.tag("else")
		g.items(depth+1, g.r.IntN(3))
	}
	g.tag("endif")
}

func (g *jdGen) tag(inner string) {
	spelled := strings.Replace(g.pick("{% _ %}", "{% _ %}", "{% _ %}", "{%_%}", "{%  _  %}"), "_", inner, 1)
	switch k := g.r.IntN(10); {
	case k < 6: // alone on its line
		if !g.atLineStart() {
			g.b.WriteString("\n")
		}
		g.b.WriteString(g.pick("", "", "", "", "  ", "    ", "\t", " \t"))
		g.b.WriteString(spelled)
		g.b.WriteString(g.pick("", "", "", "", "", " ", "  ", "\t"))
		g.b.WriteString("\n")
	case k < 8: // inline in text
		g.b.WriteString(g.pick("", "text ", "前", "<&> "))
		g.b.WriteString(spelled)
		g.b.WriteString(g.pick("", " text", "後", ""))
	default: // at its line's start, indented or not, with what follows on the same line
		if !g.atLineStart() {
			g.b.WriteString("\n")
		}
		g.b.WriteString(g.pick("", "  ", "\t"))
		g.b.WriteString(spelled)
	}
}
