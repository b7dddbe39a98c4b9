package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
)

var (
	// codePath is a repository file a doc names in code quotes: `internal/sink/view.go`.
	codePath = regexp.MustCompile("`((?:cmd|internal|pkg|e2e|deploy|schemas|examples|docs|builders)/[A-Za-z0-9_./-]+\\.[a-z]+)`")
	// qualified is a Go identifier a doc names with its package: `rank.Latest`, `chstore.NoSpace`.
	qualified = regexp.MustCompile("`([a-z][a-z0-9]*)\\.([A-Z][A-Za-z0-9_]*)(?:\\(\\))?`")
)

// TestDocsNameWhatExists: every repository path a doc (README.md, docs/, deploy/README.md,
// schemas/README.md) names in code quotes exists, and every identifier it names as package.Name
// is declared by a Go package of that name in the repository. A doc that names a moved or renamed
// thing fails here.
func TestDocsNameWhatExists(t *testing.T) {
	root := filepath.Join("..", "..")
	decls := packageDecls(t, root)
	docs := []string{"README.md", "deploy/README.md", "schemas/README.md"}
	matches, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, m := range matches {
		rel, _ := filepath.Rel(root, m)
		docs = append(docs, filepath.ToSlash(rel))
	}
	for _, doc := range docs {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range codePath.FindAllStringSubmatch(string(text), -1) {
			path := strings.TrimSuffix(m[1], ".")
			if strings.ContainsAny(path, "*<>{}") {
				continue // a pattern, not a file
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(path))); err != nil {
				t.Errorf("%s names %s, which does not exist", doc, path)
			}
		}
		for _, m := range qualified.FindAllStringSubmatch(string(text), -1) {
			pkg, name := m[1], m[2]
			names, known := decls[pkg]
			if !known {
				continue // not a package of this repository (json.Marshal, http.Client)
			}
			if !names[name] {
				t.Errorf("%s names %s.%s, which no package %s here declares", doc, pkg, name, pkg)
			}
		}
	}
}

// packageDecls are the top-level declarations of every Go package of the repository (tests
// aside), by package name: the union where two directories share a name.
func packageDecls(t *testing.T, root string) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		names, err := declarations(path)
		if err != nil {
			return err
		}
		pkg := filepath.Base(filepath.Dir(path))
		if out[pkg] == nil {
			out[pkg] = map[string]bool{}
		}
		for n := range names {
			out[pkg][n] = true
			if _, method, ok := strings.Cut(n, "."); ok {
				out[pkg][method] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBuildNamesEveryBinary: `make build`'s description (Makefile) and docs/development.md list
// every command under cmd/.
func TestBuildNamesEveryBinary(t *testing.T) {
	root := filepath.Join("..", "..")
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := os.ReadFile(filepath.Join(root, "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, build, _ := strings.Cut(string(makefile), "\nbuild: ## ")
	build, _, _ = strings.Cut(build, "\n")
	_, devBuild, _ := strings.Cut(string(dev), "make build ")
	devBuild, _, _ = strings.Cut(devBuild, "\n")
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if !regexp.MustCompile(`\b` + e.Name() + `\b`).MatchString(build) {
			t.Errorf("the Makefile's build description (%q) does not name cmd/%s", build, e.Name())
		}
		if !strings.Contains(devBuild, "bin/"+e.Name()) {
			t.Errorf("docs/development.md's make build line (%q) does not name bin/%s", devBuild, e.Name())
		}
	}
}

// TestDeployREADMENamesWhatShips: deploy/README.md's rows name every binary the Dockerfile builds,
// every service compose.yaml runs, every job prometheus.yml scrapes, and every Deployment of k8s/.
func TestDeployREADMENamesWhatShips(t *testing.T) {
	root := filepath.Join("..", "..", "deploy")
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readme := read("README.md")
	row := func(file string) string {
		_, r, ok := strings.Cut(readme, "| `"+file+"` |")
		if !ok {
			t.Fatalf("deploy/README.md has no row for %s", file)
		}
		r, _, _ = strings.Cut(r, "\n")
		return r
	}
	check := func(file, what string, names []string) {
		t.Helper()
		if len(names) == 0 {
			t.Fatalf("read no %s from %s", what, file)
		}
		r := row(file)
		for _, n := range names {
			if !strings.Contains(r, n) {
				t.Errorf("deploy/README.md's row of %s does not name the %s %s: %s", file, what, n, r)
			}
		}
	}
	var binaries []string
	for _, m := range regexp.MustCompile(`\./cmd/([a-z]+)`).FindAllStringSubmatch(read("Dockerfile"), -1) {
		binaries = append(binaries, "`"+m[1]+"`")
	}
	check("Dockerfile", "binary", binaries)
	var services []string
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z]+):\s*$`).FindAllStringSubmatch(read("compose.yaml"), -1) {
		name := map[string]string{"nats": "NATS", "clickhouse": "ClickHouse", "prometheus": "Prometheus", "grafana": "Grafana", "tempo": "Tempo", "ranker": "rankers", "composer": "composers", "archiver": "archivers", "console": "console", "migrate": "migrate"}[m[1]]
		if name == "" {
			t.Errorf("compose.yaml runs %s, which this test does not know how deploy/README.md names", m[1])
			continue
		}
		services = append(services, name)
	}
	check("compose.yaml", "service", services)
	var jobs []string
	for _, m := range regexp.MustCompile(`job_name: ([a-z]+)`).FindAllStringSubmatch(read("prometheus/prometheus.yml"), -1) {
		jobs = append(jobs, m[1])
	}
	check("prometheus/prometheus.yml", "job", jobs)
	deployments, _ := filepath.Glob(filepath.Join(root, "k8s", "*.yaml"))
	var names []string
	for _, d := range deployments {
		if strings.Contains(read(filepath.Join("k8s", filepath.Base(d))), "kind: Deployment") {
			names = append(names, strings.TrimSuffix(filepath.Base(d), ".yaml"))
		}
	}
	check("k8s/", "Deployment", names)
}

// TestDocsNameMetricsThatExist: every series a doc names in code quotes (ranker_..., composer_...,
// archiver_..., console_..., <service>_...) is one docs/metrics-reference.md, generated from the
// code, lists.
func TestDocsNameMetricsThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	ref, err := os.ReadFile(filepath.Join(root, "docs", "metrics-reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_<>]+)`").FindAllStringSubmatch(string(ref), -1) {
		listed[m[1]] = true
	}
	series := regexp.MustCompile("`((?:ranker|composer|archiver|console|<service>)_[a-z_]+)(?:\\{[^}]*\\})?`")
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"))
	for _, doc := range docs {
		if filepath.Base(doc) == "metrics-reference.md" {
			continue
		}
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range series.FindAllStringSubmatch(string(text), -1) {
			name := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(m[1], "")
			_, rest, _ := strings.Cut(name, "_")
			if !listed[m[1]] && !listed[name] && !listed["<service>_"+rest] { // a series every service has, named for one
				t.Errorf("%s names the series %s, which docs/metrics-reference.md does not list", filepath.Base(doc), m[1])
			}
		}
	}
}

// TestDocsNameSettingsThatExist: every environment variable a doc names in code quotes is a
// setting of docs/configuration.md (generated from the code), under its own name or the shared
// name a service prefix overrides (HTTP_ADDR for RANKER_HTTP_ADDR, PODIUM_X for the CLI's X), or a
// variable the tests read, or a name that is not a setting (a stream or bucket, OpenTelemetry's
// own, a benchmark's).
func TestDocsNameSettingsThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	conf, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]bool{}
	for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]+)`").FindAllStringSubmatch(string(conf), -1) {
		settings[m[1]] = true
	}
	// The CLI's own settings, read with the prefix PODIUM_ (cmd/podium's configuration struct).
	cli, _ := filepath.Glob(filepath.Join(root, "cmd", "podium", "*.go"))
	for _, f := range cli {
		b, _ := os.ReadFile(f)
		for _, m := range regexp.MustCompile(`envconfig:"([A-Z][A-Z0-9_]+)"`).FindAllStringSubmatch(string(b), -1) {
			settings["PODIUM_"+m[1]] = true
		}
	}
	read := map[string]bool{} // variables the code reads by name (tests' switches)
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && d.Name() == "node_modules" {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, ".go") {
			b, _ := os.ReadFile(path)
			for _, m := range regexp.MustCompile(`Getenv\("([A-Z][A-Z0-9_]+)"\)`).FindAllStringSubmatch(string(b), -1) {
				read[m[1]] = true
			}
		}
		return nil
	})
	known := func(v string) bool {
		if settings[v] || read[v] {
			return true
		}
		for _, p := range []string{"OTEL_", "BENCH_", "KV_", "OBJ_"} { // OpenTelemetry's, benchmarks', streams of buckets
			if strings.HasPrefix(v, p) {
				return true
			}
		}
		for _, p := range []string{"", "RANKER_", "COMPOSER_", "ARCHIVER_", "CONSOLE_", "PODIUM_"} {
			shared := strings.TrimPrefix(v, p)
			for _, q := range []string{"", "RANKER_", "COMPOSER_", "ARCHIVER_", "CONSOLE_", "PODIUM_"} {
				if settings[q+shared] {
					return true
				}
			}
		}
		return false
	}
	notSettings := map[string]bool{"BUILDER_MODULES": true, "BUILDER_RELEASES": true, "COMPOSER_API": true, events.BucketRankerPasses: true}
	// The NATS server's own variables: each user's password in deploy/nats/nats.conf.
	conf, err = os.ReadFile(filepath.Join(root, "deploy", "nats", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$(PODIUM_[A-Z_]+_PASSWORD)`).FindAllStringSubmatch(string(conf), -1) {
		notSettings[m[1]] = true
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"))
	for _, doc := range docs {
		if filepath.Base(doc) == "configuration.md" {
			continue
		}
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9]*_[A-Z0-9_]+)(?:=[^`]*)?`").FindAllStringSubmatch(string(text), -1) {
			if v := m[1]; !known(v) && !notSettings[v] {
				t.Errorf("%s names %s, which is no setting of docs/configuration.md and nothing the code reads", filepath.Base(doc), v)
			}
		}
	}
}

// TestDocsNameCommandsThatExist: every `podium ...` command line a doc shows names a command of
// cmd/podium/commands.go (or help).
func TestDocsNameCommandsThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	table, err := os.ReadFile(filepath.Join(root, "cmd", "podium", "commands.go"))
	if err != nil {
		t.Fatal(err)
	}
	commands := map[string]bool{"help": true}
	groups := map[string]bool{}
	for _, m := range regexp.MustCompile(`\{[a-z]+, "([a-z][a-z -]*)",`).FindAllStringSubmatch(string(table), -1) {
		commands[m[1]] = true
		group, _, _ := strings.Cut(m[1], " ")
		groups[group] = true
	}
	if len(commands) < 20 {
		t.Fatalf("read %d commands from cmd/podium/commands.go", len(commands))
	}
	line := regexp.MustCompile(`(?m)(?:^\$ (?:[A-Z_]+=\S+ )*|` + "`" + `)podium ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?`)
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"))
	for _, doc := range docs {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range line.FindAllStringSubmatch(string(text), -1) {
			one, two := m[1], strings.TrimSpace(m[1]+" "+m[2])
			switch {
			case commands[two], commands[one]:
			case groups[one] && m[2] == "":
			default:
				t.Errorf("%s shows `podium %s`, which cmd/podium/commands.go does not define", filepath.Base(doc), two)
			}
		}
	}
}

// TestEveryAlertIsTested: every alert of deploy/prometheus/alerts.yml has a promtool unit test in
// alerts_test.yml (deploy/check runs them), and every Podium* alert a doc names exists.
func TestEveryAlertIsTested(t *testing.T) {
	root := filepath.Join("..", "..")
	rules, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, m := range regexp.MustCompile(`alert: (\w+)`).FindAllStringSubmatch(string(rules), -1) {
		alerts[m[1]] = true
		if !strings.Contains(string(tests), "alertname: "+m[1]+"\n") {
			t.Errorf("alert %s has no unit test in deploy/prometheus/alerts_test.yml", m[1])
		}
	}
	if len(alerts) < 5 {
		t.Fatalf("read %d alerts", len(alerts))
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"))
	for _, doc := range docs {
		text, _ := os.ReadFile(doc)
		for _, m := range regexp.MustCompile("`(Podium[A-Z]\\w+)`").FindAllStringSubmatch(string(text), -1) {
			if !alerts[m[1]] {
				t.Errorf("%s names the alert %s, which alerts.yml does not define", filepath.Base(doc), m[1])
			}
		}
	}
}
