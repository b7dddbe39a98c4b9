package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestBuildersWithinTheirBudget: a module that declares more than a builder may have (a table's
// maximum, globals, locals) is refused at push naming the limit; a module whose table declares no
// maximum and grows it by 2^28 slots (2 GiB of the composer's memory before, past its time limit)
// is served, runs within the budget given to its table, and falls back with its reason, while the
// composer stays alive, ready and small (docs/security.md).
func TestBuildersWithinTheirBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer", "COMPOSER_RENDER_TIMEOUT=4s")

	for _, c := range []struct {
		name   string
		module []byte
		want   string
	}{
		{"big-table", testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{4: testenv.Section(4, []byte{1}, testenv.WasmTable(0, 1<<28, true))}),
			"table 0 declares a maximum of 268435456 slots: the module's tables would hold more than 1048576 slots"},
		{"many-globals", testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{6: testenv.Section(6, testenv.U32(1<<16+1))}),
			"the module declares 65537 globals, over 65536"},
		{"many-locals", testenv.WasmCommand(append(testenv.U32(1), append(testenv.U32(1<<20), 0x7f)...), nil, nil),
			"function 0 declares more than 65536 locals"},
	} {
		out, code := e.podium(t, nil, "builders", "push", writeModule(t, c.name, c.module), "--name", c.name, "--models", c.name)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("push %s: exit %d\n%s\nwant it refused saying %q", c.name, code, out, c.want)
		}
	}

	const name = "table-grower"
	grower := testenv.WasmCommand(testenv.NoLocals, testenv.TableGrow(1<<28), map[byte][]byte{4: testenv.Section(4, []byte{1}, testenv.WasmTable(0, 0, false))})
	if out, code := e.podium(t, nil, "builders", "push", writeModule(t, name, grower), "--name", name, "--models", name); code != 0 {
		t.Fatalf("push %s: exit %d\n%s", name, code, out)
	}
	if out, code := e.podium(t, nil, "builders", "label", name, "1", "production"); code != 0 {
		t.Fatalf("label %s: exit %d\n%s", name, code, out)
	}
	testenv.WaitFor(t, 10*time.Second, name+" served", func() (bool, string) {
		n := composer.metric(t, fmt.Sprintf(`composer_builders_served{name=%q,version="1"}`, name))
		return n == 1, fmt.Sprint(n)
	})
	e.publishEvaluation("grow-e1", evaluation("grow", "t1", "One", 1, 50, "work", t0))
	for r := range 3 { // three runs: the grow fails each time, within the budget
		team := fmt.Sprintf("t%d", r+1)
		e.requestRound("grow-"+team, events.RoundRequested{ExecutionID: "grow", TeamID: team, TeamName: "Team", RoundNumber: 2, UserPrompt: "Go.", Model: name}, t0.Add(time.Minute))
		got := e.composedFor(t, "grow", team)
		if got.Builder == nil || !got.Builder.Fallback || !strings.HasPrefix(got.Builder.Reason, "builder invalid_output") {
			t.Errorf("%s: builder %+v, want a fallback: the module ran to its end and wrote nothing", team, got.Builder)
		}
	}
	composer.waitOK(t, "http://"+composer.addr+"/readyz")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", composer.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			t.Logf("the composer's largest resident set: %d MiB", kb>>10)
			if kb > 1<<20 {
				t.Errorf("the composer's largest resident set is %d MiB, want under 1 GiB", kb>>10)
			}
		}
	}
}
