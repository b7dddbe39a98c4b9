package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestJavaScriptOrchestrator plays a tournament from Node (examples/orchestrator-js): published
// events and every answer validated with ajv against schemas/, answers awaited the documented way,
// a replayed evaluation changing nothing, and `podium prompts verify --all` at the end.
func TestJavaScriptOrchestrator(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "examples", "orchestrator-js")
	node, err := exec.LookPath("node")
	_, modErr := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", "jetstream"))
	if err != nil || modErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node or the example's packages are missing (make test installs them: npm ci --prefix examples/orchestrator-js): %v %v", err, modErr)
		}
		t.Skip("node or examples/orchestrator-js/node_modules missing: run `npm ci --prefix examples/orchestrator-js`")
	}
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")
	cmd := exec.Command(node, "orchestrator.mjs", "js-e2e")
	cmd.Dir = dir
	cmd.Env = append(e.baseEnv(), "PODIUM_BIN="+filepath.Join(bins.dir, "podium"), "HOME="+t.TempDir(), "RANKER_URL=http://"+ranker.addr)
	out, err := cmd.CombinedOutput()
	t.Logf("node orchestrator.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the JavaScript orchestrator failed: %v", err)
	}
	for _, want := range []string{"9 record(s) verified", "the replay changed nothing"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("its output lacks %q", want)
		}
	}
}
