package e2e

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// BenchmarkBuilderVersusTemplate composes the same prompts through one composer along each path:
// the example builder as a Go reactor (builders/phi4mini, -buildmode=c-shared: its runtime started
// once), the same Go builder as a command (its runtime started in every call), the same builder in
// C (builders/phi4mini-c) and in Rust (builders/phi4mini-rs), each labelled production for a model
// of its own, and the team-round
// template (a model no builder serves). It reports the composer's CPU per prompt of each and each
// builder's ratio to the template. The executions hold distinct texts (coldText), so no read or
// render is a repeat. BENCH_PROMPTS sets the prompts of each path (default 200);
// BENCH_BUILDER_PROFILE=FILE saves two seconds of the composer's CPU profile while the path
// BENCH_BUILDER_PROFILE_OF names (default go-reactor) composes.
func BenchmarkBuilderVersusTemplate(b *testing.B) {
	prompts := 200
	if s := os.Getenv("BENCH_PROMPTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_PROMPTS=%q: want a whole number of 1 or more", s)
		}
		prompts = n
	}
	e := newEnv(b)
	e.start("ranker")
	composer := e.start("composer", "PPROF=true")
	paths := []struct {
		name   string
		module []byte // nil: the template
	}{
		{"go-reactor", testenv.BuildWasmReactor(b, "../builders/phi4mini")},
		{"go-command", testenv.BuildWasm(b, "../builders/phi4mini")},
		{"c", testenv.BuildC(b, "../builders/phi4mini-c")},
		{"rust", testenv.BuildRust(b, "../builders/phi4mini-rs")},
		{"template", nil},
	}
	for _, p := range paths {
		if p.module == nil {
			continue
		}
		name := "phi4mini-" + p.name
		for _, args := range [][]string{{"builders", "push", writeModule(b, name, p.module), "--name", name, "--models", "bench-" + p.name + "*"}, {"builders", "label", name, "1", "production"}} {
			if out, code := e.podium(b, nil, args...); code != 0 {
				b.Fatalf("podium %v: exit %d\n%s", args, code, out)
			}
		}
		testenv.WaitFor(b, 10*time.Second, "the composer serving "+name, func() (bool, string) {
			return composer.metric(b, `composer_builders_served{name="`+name+`",version="1"}`) == 1, ""
		})
	}
	const teams, rounds = 10, 4
	// One execution per path, with the same evaluations.
	for _, p := range paths {
		exec := "bench-" + p.name
		for team := range teams {
			for round := 1; round <= rounds; round++ {
				id := fmt.Sprintf("%s-%d-%d", exec, team, round)
				e.publishEvaluation(id, evaluation(exec, fmt.Sprintf("t%02d", team), fmt.Sprintf("Team %02d", team), round,
					float64((team*7+round*3)%100)/100, coldText(uint64(team*100+round), 1500), t0))
			}
		}
	}
	pid := composer.cmd.Process.Pid
	b.ResetTimer()
	perPrompt := map[string]float64{}
	for _, p := range paths {
		exec, model := "bench-"+p.name, "bench-"+p.name+"-phi-4-mini"
		cpu := cpuSince(pid)
		if out := os.Getenv("BENCH_BUILDER_PROFILE"); out != "" && p.name == cmp.Or(os.Getenv("BENCH_BUILDER_PROFILE_OF"), "go-reactor") {
			go saveProfile(b, composer, out)
		}
		for i := range prompts {
			team := i % teams
			e.requestRound(fmt.Sprintf("%s-req-%d", exec, i), events.RoundRequested{ExecutionID: exec, TeamID: fmt.Sprintf("t%02d", team),
				TeamName: fmt.Sprintf("Team %02d", team), RoundNumber: rounds + 1 + i/teams, UserPrompt: "Write the best possible design document for a rate limiter.",
				Model: model}, t0.Add(time.Duration(i)*time.Second))
		}
		answers := e.answers("prompt.*."+exec+".*", prompts, 5*time.Minute)
		used := cpu()[0]
		for id, a := range answers {
			built := a.ok() && a.composed.Builder != nil && !a.composed.Builder.Fallback
			if !a.ok() || built != (p.module != nil) {
				b.Fatalf("%s: answered %s, built %v", id, a.subject, built)
			}
		}
		perPrompt[p.name] = used / float64(prompts) * 1e6
	}
	b.StopTimer()
	line := ""
	for _, p := range paths {
		b.ReportMetric(perPrompt[p.name], p.name+"-cpu-us/prompt")
		if p.module != nil {
			ratio := perPrompt[p.name] / perPrompt["template"]
			b.ReportMetric(ratio, p.name+"/template")
			line += fmt.Sprintf("%s %.0f us (x%.2f the template), ", p.name, perPrompt[p.name], ratio)
		}
	}
	b.Logf("composer CPU per prompt: %stemplate %.0f us; %d prompts each", line, perPrompt["template"], prompts)
}
