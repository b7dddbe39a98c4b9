package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
)

// TestInputsFromOutsideAreBounded: every input the CLI reads whole from outside is read with a
// limit checked while reading (docs/security.md): a bundle that decompresses to far more than its
// file (64 MiB of blanks in about 80 KB, under a 1 MiB PODIUM_MAX_INPUT_BYTES) ends with an error naming
// the limit and its setting (TestReadBundleIsBounded, in internal/audit, measures its memory); so do an event to publish, a request and a template
// over MAX_EVENT_BYTES, an --evaluations file over PODIUM_MAX_INPUT_BYTES, and a builder module over
// 64 MiB.
func TestInputsFromOutsideAreBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}

	// The bomb: a bundle header, then 64 MiB of blanks, gzip-compressed.
	bundle := write("bomb.json.gz", testenv.BundleBomb(64))

	big := bytes.Repeat([]byte("x"), 2<<20) // over MAX_EVENT_BYTES (1 MiB)
	folder := filepath.Join(dir, "tmpl")
	if err := os.MkdirAll(folder, 0o755); err != nil {
		t.Fatal(err)
	}
	write("tmpl/prompt.mustache", []byte("Hello {{team.name}}\n"))
	write("tmpl/notes.md", big[:600<<10])
	write("tmpl/more.md", big[:600<<10]) // each file under the limit, the folder over it
	module := write("big.wasm", bytes.Repeat([]byte{0}, 64<<20+1))
	request := write("request.json", append(append([]byte(`{"execution_id": "x", "team_id": "t", "team_name": "T", "round_number": 1, "user_prompt": "`), big...), '"', '}'))
	evals := write("evals.json", append(append([]byte(`[{"padding": "`), big...), '"', '}', ']'))
	event := write("event.json", append(append([]byte(`{"padding": "`), big...), '"', '}'))

	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"prompts", "verify", "--bundle", bundle}, []string{"PODIUM_MAX_INPUT_BYTES=1048576"},
			"bundle " + bundle + " is larger than 1048576 bytes, the limit (raise it with PODIUM_MAX_INPUT_BYTES)"},
		{[]string{"templates", "push", folder}, nil, "template " + folder + " is larger than 1048576 bytes, the limit (raise it with MAX_EVENT_BYTES)"},
		{[]string{"templates", "render", "team-round", "--request", request}, nil, request + " is larger than 1048576 bytes, the limit (raise it with MAX_EVENT_BYTES)"},
		{[]string{"templates", "render", "team-round", "--request", write("small.json", []byte(`{"execution_id": "x", "team_id": "t", "team_name": "T", "round_number": 2, "user_prompt": "Go."}`)), "--evaluations", evals},
			[]string{"PODIUM_MAX_INPUT_BYTES=1048576"}, evals + " is larger than 1048576 bytes, the limit (raise it with PODIUM_MAX_INPUT_BYTES)"},
		{[]string{"publish", "evaluation", "--file", event}, nil, event + " is larger than 1048576 bytes, the limit (raise it with MAX_EVENT_BYTES)"},
		{[]string{"builders", "push", module, "--name", "big", "--models", "x*"}, nil, module + " is larger than 67108864 bytes, the limit"},
	} {
		cmd := exec.Command(filepath.Join(bins.dir, "podium"), c.args...)
		cmd.Env = e.baseEnv(c.env...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("podium %s: %v\n%s\nwant an error saying %q", strings.Join(c.args, " "), err, out, c.want)
		}
		t.Logf("podium %s: %s", strings.Join(c.args[:2], " "), strings.TrimSpace(fmt.Sprint(err)))
	}
}
