package e2e

import (
	"flag"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
)

var updateDocs = flag.Bool("update", false, "TestConfigurationReference: rewrite docs/configuration.md from the binaries")

// TestConfigurationReference: docs/configuration.md is what the services' --help print, which
// envconfig writes from their configuration structs; a variable added, removed or changed in
// the code without the page fails here. `go test ./e2e -run TestConfigurationReference -update`
// writes the page again.
func TestConfigurationReference(t *testing.T) {
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	var page strings.Builder
	page.WriteString("# Configuration reference\n\n" +
		"Generated from the code: each table is what `<service> --help` prints, which envconfig writes from the\n" +
		"service's configuration struct (`go test ./e2e -run TestConfigurationReference -update` writes this page\n" +
		"again; the test fails when it differs). Every variable may also be given with the service's prefix\n" +
		"(`RANKER_`, `COMPOSER_`, `CONSOLE_`, `ARCHIVER_`), which overrides the shared name. The podium CLI reads the shared\n" +
		"variables, with the prefix `PODIUM_`. What the settings mean in practice: [operating](operating.md).\n")
	for _, svc := range []string{"ranker", "composer", "console", "archiver"} {
		out, err := exec.Command(filepath.Join(bins.dir, svc), "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --help: %v\n%s", svc, err, out)
		}
		fmt.Fprintf(&page, "\n## %s\n\n| variable | default | meaning |\n|---|---|---|\n", svc)
		// The table is aligned in columns (text/tabwriter): cut each row where the header's
		// DEFAULT and MEANING start.
		def, meaning := -1, -1
		n := 0
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "VARIABLE") {
				def, meaning = strings.Index(line, "DEFAULT"), strings.Index(line, "MEANING")
				continue
			}
			if def < 0 || strings.TrimSpace(line) == "" {
				continue
			}
			if len(line) < meaning {
				t.Fatalf("%s --help: cannot read %q", svc, line)
			}
			name, dflt, what := strings.TrimSpace(line[:def]), strings.TrimSpace(line[def:meaning]), strings.TrimSpace(line[meaning:])
			fmt.Fprintf(&page, "| `%s` | %s | %s |\n", name, code(dflt), strings.ReplaceAll(what, "|", `\|`))
			n++
		}
		if n < 10 {
			t.Fatalf("%s --help listed %d variables", svc, n)
		}
	}
	testenv.Golden(t, filepath.Join("..", "docs", "configuration.md"), []byte(page.String()), *updateDocs,
		"go test ./e2e -run TestConfigurationReference -update")
}

func code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + s + "`"
}
