package compose

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
)

// nested is a template of depth sections over history, one inside the other, with inner at the
// bottom: valid Mustache, since inside a round `history` resolves to the team's history again.
func nested(depth int, inner string) string {
	return "Round {{round_number}}:" + strings.Repeat("{{#history}}", depth) + inner + strings.Repeat("{{/history}}", depth) + "\n"
}

// manyRounds is round 21 of a team with 20 evaluated rounds, all of them printed.
func manyRounds(template string) Inputs {
	var hist []events.TeamRound
	for r := 1; r <= 20; r++ {
		hist = append(hist, tr(r, float64(r), "answer", "feedback"))
	}
	req := request(21, template)
	req.MaxRounds = 0
	all := 20
	req.Limits.HistoryRounds = &all
	return Inputs{RequestID: "req-bound", Request: req, Time: roundTime, History: hist}
}

// TestRenderBoundedInWork: eight nested sections over 20 rounds are 20^8 iterations that write
// nothing but a number; the compose answers budget_exceeded after at most MaxRenderSteps steps
// (a test that hung here would end at go test's timeout), with no deadline on ctx.
func TestRenderBoundedInWork(t *testing.T) {
	l, err := loadFS(t, map[string]string{"bomb.mustache": nested(8, "{{round_number}}")})
	if err != nil {
		t.Fatalf("the template is valid and loads: %v", err)
	}
	_, err = l.Compose(context.Background(), manyRounds("bomb"))
	if failureCode(err) != events.CodeBudgetExceeded || !strings.Contains(err.Error(), "more than 4000000 steps") {
		t.Fatalf("Compose = %v, want budget_exceeded naming the steps", err)
	}
	// Naming vars, the same walk finds a missing variable: bounded too, and the first one found.
	l, err = loadFS(t, map[string]string{"bomb.mustache": nested(8, "{{vars.x}}")})
	if err != nil {
		t.Fatal(err)
	}
	in := manyRounds("bomb")
	in.Request.Vars = map[string]any{"x": "given"}
	if _, err = l.Compose(context.Background(), in); failureCode(err) != events.CodeBudgetExceeded {
		t.Fatalf("Compose with vars = %v, want budget_exceeded", err)
	}
	in.Request.Vars = nil
	if _, err = l.Compose(context.Background(), in); failureCode(err) != events.CodeTemplateError || !strings.Contains(err.Error(), `"vars.x"`) {
		t.Fatalf("Compose without vars = %v, want template_error naming vars.x", err)
	}
}

// TestRenderBoundedInSize: four nested sections over 20 rounds writing 1 KB each time are 160,000
// iterations, within the steps, and 160 MB of text, past the largest message NATS takes.
func TestRenderBoundedInSize(t *testing.T) {
	l, err := loadFS(t, map[string]string{"wide.mustache": nested(4, strings.Repeat("k", 1000))})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Compose(context.Background(), manyRounds("wide"))
	if failureCode(err) != events.CodeBudgetExceeded || !strings.Contains(err.Error(), "larger than 67108864 bytes") {
		t.Fatalf("Compose = %v, want budget_exceeded naming the size", err)
	}
	// Variables alone: 8,000 iterations printing a 10 KB task are 80 MB, refused by the walk
	// before anything is rendered (mustache would ignore the writer's refusals of variables).
	l, err = loadFS(t, map[string]string{"vars.mustache": nested(3, "{{user_prompt}}")})
	if err != nil {
		t.Fatal(err)
	}
	in := manyRounds("vars")
	in.Request.UserPrompt = strings.Repeat("task ", 2000)
	_, err = l.Compose(context.Background(), in)
	if failureCode(err) != events.CodeBudgetExceeded || !strings.Contains(err.Error(), "larger than 67108864 bytes") {
		t.Fatalf("Compose = %v, want budget_exceeded naming the size", err)
	}
	// A long text printed once is not work: 4.5 MB of task, past MaxRenderSteps in bytes.
	l, err = loadFS(t, map[string]string{"once.mustache": "{{user_prompt}}"})
	if err != nil {
		t.Fatal(err)
	}
	in = manyRounds("once")
	none := 0 // no token budget
	in.Request.Limits.MaxPromptTokens = &none
	in.Request.UserPrompt = strings.Repeat("task\n", 900_000)
	if out, err := l.Compose(context.Background(), in); err != nil || len(out.Prompt) != 4_500_000 {
		t.Fatalf("Compose = %d bytes, %v; want the 4.5 MB task whole", len(out.Prompt), err)
	}
	// Three levels, 8,000 iterations and 8 MB: composed whole.
	l, err = loadFS(t, map[string]string{"wide.mustache": nested(3, strings.Repeat("k", 1000))})
	if err != nil {
		t.Fatal(err)
	}
	in = manyRounds("wide")
	in.Request.Limits.MaxPromptTokens = &none
	out, err := l.Compose(context.Background(), in)
	if err != nil || strings.Count(out.Prompt, "k") != 8000*1000 {
		t.Fatalf("Compose = %d bytes, %v; want 8,000,000 k", len(out.Prompt), err)
	}
}

// TestRenderStopsWithItsContext: a render within the bounds but long ends when ctx ends, with
// ctx's error (the composer turns a deadline into budget_exceeded naming its timeout).
func TestRenderStopsWithItsContext(t *testing.T) {
	for name, tc := range map[string]struct {
		depth int
		inner string
	}{
		"walk":  {4, "{{round_number}}"},       // 168,000 steps: stopped while its work is counted
		"write": {2, strings.Repeat("k", 100)}, // 420 steps and 400 writes: stopped by its writes
	} {
		t.Run(name, func(t *testing.T) {
			l, err := loadFS(t, map[string]string{"long.mustache": nested(tc.depth, tc.inner)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := l.Compose(ctx, manyRounds("long")); !errors.Is(err, context.Canceled) {
				t.Fatalf("Compose = %v, want context.Canceled", err)
			}
		})
	}
}

// TestBoundedWriterStopsAtItsLimit: the writer keeps up to MaxRenderBytes and refuses the write
// that would pass it, and every write after.
func TestBoundedWriterStopsAtItsLimit(t *testing.T) {
	w := boundedWriter{ctx: context.Background()}
	chunk := make([]byte, 1<<20)
	for range MaxRenderBytes >> 20 {
		if _, err := w.Write(chunk); err != nil {
			t.Fatalf("write within the limit: %v", err)
		}
	}
	if _, err := w.Write([]byte{'x'}); !errors.Is(err, errRenderTooLarge) {
		t.Fatalf("write past the limit = %v", err)
	}
	if _, err := w.Write(nil); !errors.Is(err, errRenderTooLarge) || w.buf.Len() != MaxRenderBytes {
		t.Fatalf("after the limit: %v, %d bytes kept", err, w.buf.Len())
	}
}
