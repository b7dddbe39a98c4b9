package e2e

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// BenchmarkBuilderVersusTemplate composes the same prompts three times through one composer: with
// the Go example builder (builders/phi4mini, labelled production for its model), with the same
// builder in C (builders/phi4mini-c, for another model) and with the team-round template (a model
// no builder serves), and reports the composer's CPU per prompt of each and their ratios. The executions hold distinct texts (coldText), so no read or render is a repeat.
// BENCH_PROMPTS sets the prompts of each path (default 200).
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
	module := writeModule(b, "phi4mini", testenv.BuildWasm(b, "../builders/phi4mini"))
	moduleC := writeModule(b, "phi4mini-c", testenv.BuildC(b, "../builders/phi4mini-c"))
	for _, args := range [][]string{{"builders", "push", module, "--name", "phi4mini", "--models", "bench-phi*"}, {"builders", "label", "phi4mini", "1", "production"},
		{"builders", "push", moduleC, "--name", "phi4mini-c", "--models", "bench-c-phi*"}, {"builders", "label", "phi4mini-c", "1", "production"}} {
		if out, code := e.podium(b, nil, args...); code != 0 {
			b.Fatalf("podium %v: exit %d\n%s", args, code, out)
		}
	}
	testenv.WaitFor(b, 10*time.Second, "the composer serving both builders", func() (bool, string) {
		return composer.metric(b, `composer_builders_served{name="phi4mini",version="1"}`) == 1 &&
			composer.metric(b, `composer_builders_served{name="phi4mini-c",version="1"}`) == 1, ""
	})
	const teams, rounds = 10, 4
	// Two executions with the same evaluations: one composed through the builder, one through the
	// template.
	for _, exec := range []string{"bench-builder", "bench-c-builder", "bench-template"} {
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
	for _, path := range []struct{ exec, model string }{{"bench-builder", "bench-phi-4-mini"}, {"bench-c-builder", "bench-c-phi-4-mini"}, {"bench-template", "bench-plain"}} {
		cpu := cpuSince(pid)
		// Two seconds of the composer building (BENCH_BUILDER_PROFILE_OF=bench-c-builder: the C one).
		if out := os.Getenv("BENCH_BUILDER_PROFILE"); out != "" && path.exec == cmp.Or(os.Getenv("BENCH_BUILDER_PROFILE_OF"), "bench-builder") {
			go saveProfile(b, composer, out)
		}
		for i := range prompts {
			team := i % teams
			e.requestRound(fmt.Sprintf("%s-req-%d", path.exec, i), events.RoundRequested{ExecutionID: path.exec, TeamID: fmt.Sprintf("t%02d", team),
				TeamName: fmt.Sprintf("Team %02d", team), RoundNumber: rounds + 1 + i/teams, UserPrompt: "Write the best possible design document for a rate limiter.",
				Model: path.model}, t0.Add(time.Duration(i)*time.Second))
		}
		answers := e.answers("prompt.*."+path.exec+".*", prompts, 5*time.Minute)
		used := cpu()[0]
		for id, a := range answers {
			built := a.ok() && a.composed.Builder != nil && !a.composed.Builder.Fallback
			if !a.ok() || built != strings.Contains(path.model, "phi") {
				b.Fatalf("%s: answered %s, built %v", id, a.subject, built)
			}
		}
		perPrompt[path.exec] = used / float64(prompts) * 1e6
	}
	b.StopTimer()
	b.ReportMetric(perPrompt["bench-builder"], "builder-cpu-us/prompt")
	b.ReportMetric(perPrompt["bench-c-builder"], "c-builder-cpu-us/prompt")
	b.ReportMetric(perPrompt["bench-template"], "template-cpu-us/prompt")
	b.ReportMetric(perPrompt["bench-builder"]/perPrompt["bench-template"], "builder/template")
	b.ReportMetric(perPrompt["bench-c-builder"]/perPrompt["bench-template"], "c-builder/template")
	b.Logf("composer CPU per prompt: Go builder %.0f us (x%.2f the template), C builder %.0f us (x%.2f), template %.0f us; %d prompts each",
		perPrompt["bench-builder"], perPrompt["bench-builder"]/perPrompt["bench-template"], perPrompt["bench-c-builder"],
		perPrompt["bench-c-builder"]/perPrompt["bench-template"], perPrompt["bench-template"], prompts)
}
