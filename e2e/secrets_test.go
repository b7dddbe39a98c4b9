package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// passwordSpecials are the characters of a password that mean something in a URL, a JSON string, a
// shell or a list: each is tried in every variable that can carry a secret.
const passwordSpecials = "/?#@:%&=+$,; []'\"\\<>!*(){}|^`~"

// TestNoBinaryPrintsAPassword: every binary, given passwords holding each special character in
// every variable that can carry one (a NATS URL's userinfo, NATS_PASSWORD, CLICKHOUSE_PASSWORD, the
// API tokens, OTLP headers, an OTLP endpoint's userinfo), each unusable so that the binary reports
// an error (no NATS server where the URL points, no ClickHouse), never prints one of them: not in
// its error, its logs at debug level, nor its --help. Each password carries a marker that no output
// may hold, so a password cut at its special character and printed in part is found too.
func TestNoBinaryPrintsAPassword(t *testing.T) {
	t.Parallel()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	// What each binary is run with: a command that connects, and --help.
	runs := map[string][][]string{
		"ranker":   {nil, {"--help"}},
		"composer": {nil, {"--help"}},
		"archiver": {nil, {"--help"}},
		"console":  {nil, {"--help"}},
		"podium":   {{"prompts", "show", "x", "t", "1"}, {"export", "--execution", "x"}, {"--help"}},
	}
	for name, argSets := range runs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Six characters a run (each password holds them all, its marker after the last, so a
			// password cut at any of them leaks its marker): five runs a command, not thirty.
			for i := 0; i < len(passwordSpecials); i += 6 {
				chars := passwordSpecials[i:min(i+6, len(passwordSpecials))]
				marker := func(kind string) string { return fmt.Sprintf("LEAK%s%d", kind, i) }
				pw := func(kind string) string {
					p := "zq"
					for _, c := range chars {
						p += string(c) + "Kx7"
					}
					return p + marker(kind)
				}
				env := []string{
					"PATH=" + os.Getenv("PATH"), "LOG_LEVEL=debug", "NATS_CONNECT_WAIT=0", "HTTP_ADDR=127.0.0.1:0", "CONSOLE_ADDR=127.0.0.1:0",
					"NATS_URL=nats://ranker:" + pw("Url") + "@127.0.0.1:1",
					"NATS_USER=ranker", "NATS_PASSWORD=" + pw("Nats"), "RANKER_API_NATS_USER=ranker-api", "RANKER_API_NATS_PASSWORD=" + pw("ApiNats"),
					"CLICKHOUSE_ADDR=127.0.0.1:1", "CLICKHOUSE_USER=ranker", "CLICKHOUSE_PASSWORD=" + pw("Ch"),
					"COMPOSER_API_TOKEN=" + pw("ComposerToken"), "RANKER_API_TOKEN=" + pw("RankerToken"),
					"CONSOLE_AUTH_TOKEN=" + pw("ConsoleToken"), "API_TOKEN=" + pw("Token"),
					"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer " + pw("Otel"),
					"OTEL_EXPORTER_OTLP_ENDPOINT=http://u:" + pw("Endpoint") + "@127.0.0.1:1",
				}
				for _, args := range argSets {
					out, code := runBinary(t, name, env, args)
					help := len(args) == 1 && args[0] == "--help"
					if !help && code == 0 {
						t.Errorf("%s %v with unusable credentials exited 0:\n%s", name, args, out)
					}
					if strings.Contains(out, "LEAK") {
						t.Errorf("%s %v printed a password holding %q:\n%s", name, args, chars, out)
					}
				}
			}
		})
	}
}

// runBinary runs a binary of the package run to its end (20 s at most) and returns what it printed
// and its exit status.
func runBinary(t *testing.T, name string, env, args []string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bins.dir, name), args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not end within 20 s:\n%s", name, args, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}
