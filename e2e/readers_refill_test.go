package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// setRefilling publishes on the ranker's consumer what a ranker that refills its store publishes
// there (why; "" when it is done), as the ranker's lineage check does.
func setRefilling(t *testing.T, e *env, why string) {
	t.Helper()
	cons, err := e.js.Consumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	md := map[string]string{}
	for k, v := range cfg.Metadata {
		if k != events.MetaStoreRefilling {
			md[k] = v
		}
	}
	if why != "" {
		md[events.MetaStoreRefilling] = why
	}
	cfg.Metadata = md
	if _, err := e.js.UpdateConsumer(t.Context(), events.StreamEvaluations, cfg); err != nil {
		t.Fatal(err)
	}
}

// TestReadersRefuseAStoreBeingRefilled: while the ranker refills its store from EVALUATIONS (it
// says so on its consumer before it touches the table), a read sees part of the evaluations, or
// none. The readers outside the services refuse to read it then, naming why, rather than print a
// short board, export a short bundle and exit 0, or report false differences: `podium
// leaderboard`, `history`, `export`, `prompts verify` and `templates compare` exit non-zero, and
// the console answers 503. Once the refill is done they read as before. Without the ranker's
// consumer, whether a refill runs is unknown, and they refuse too.
func TestReadersRefuseAStoreBeingRefilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")
	const exec = "readers"
	n := lineageTournament(t, e, exec, 3, 2)
	promptOf(t, e, exec, "t1", 3)
	console := e.start("console")
	// The refilling ranker stands still (stopped here), so what it published stays.
	if _, err := ranker.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	setRefilling(t, e, "the evaluations table is missing")

	bundle := filepath.Join(t.TempDir(), "bundle.podium.json.gz")
	for _, args := range [][]string{
		{"leaderboard", exec},
		{"history", exec, "t1"},
		{"export", "--execution", exec, "--out", bundle},
		{"prompts", "verify", "--all", "--execution", exec},
		{"templates", "compare", "team-round", "--execution", exec},
	} {
		out, code := e.podium(t, nil, args...)
		if code == 0 || !strings.Contains(out, "refilling its store") || strings.Contains(out, "differ") {
			t.Errorf("podium %s during a refill: exit %d, want non-zero naming the refill\n%s", strings.Join(args, " "), code, out)
		}
	}
	if _, err := os.Stat(bundle); err == nil {
		t.Error("export wrote a bundle during a refill")
	}
	status, page := getPage(t, "http://"+console.addr+"/executions/"+exec)
	if status != http.StatusServiceUnavailable || !strings.Contains(page, "refilling its store") {
		t.Errorf("console during a refill: %d, want 503 naming the refill\n%.2000s", status, page)
	}

	setRefilling(t, e, "")
	out, code := e.podium(t, nil, "leaderboard", exec)
	if code != 0 || !strings.Contains(out, "t1") {
		t.Errorf("podium leaderboard after the refill: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", exec); code != 0 {
		t.Errorf("podium prompts verify after the refill: exit %d\n%s", code, out)
	}
	if status, page := getPage(t, "http://"+console.addr+"/executions/"+exec); status != http.StatusOK {
		t.Errorf("console after the refill: %d\n%.2000s", status, page)
	}
	// Without the ranker's consumer nothing says whether a refill runs: unknown, refused.
	if err := e.js.DeleteConsumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker); err != nil {
		t.Fatal(err)
	}
	if out, code := e.podium(t, nil, "leaderboard", exec); code == 0 || !strings.Contains(out, "consumer on EVALUATIONS is missing") {
		t.Errorf("podium leaderboard without the ranker's consumer: exit %d, want refused naming it\n%s", code, out)
	}
	t.Logf("%d evaluations; every reader refused the store while the ranker refilled it (or its state was unknown), and read it after", n)
}

// getPage is an HTTP GET's status and body.
func getPage(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}
