package docs

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite docs/metrics-reference.md from the code")

// metric is one collector the code defines: its name (with <service> where the namespace is the
// running service's), kind, labels and help.
type metric struct {
	name, kind, help string
	labels           []string
	where            string
}

// TestMetricsReference: docs/metrics-reference.md lists every Prometheus collector the services
// define, read from the code (every prometheus.*Opts literal: namespace, name, help, and the
// labels of the vector it makes); it fails when the page differs.
// `go test ./internal/docs -run TestMetricsReference -update` writes it again.
func TestMetricsReference(t *testing.T) {
	root := filepath.Join("..", "..")
	var metrics []metric
	for _, dir := range []string{"cmd", "internal", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			if filepath.Base(filepath.Dir(path)) == "series" {
				return nil // the factory itself: it declares no series
			}
			found, err := metricsOf(path)
			if err != nil {
				return err
			}
			for i := range found {
				found[i].where, _ = filepath.Rel(root, filepath.Dir(path))
			}
			metrics = append(metrics, found...)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.SortFunc(metrics, func(a, b metric) int { return strings.Compare(a.name, b.name) })
	var page strings.Builder
	page.WriteString("# Metrics reference\n\n" +
		"Generated from the code: every Prometheus collector the services define (`go test ./internal/docs\n" +
		"-run TestMetricsReference -update` writes this page again; the test fails when it differs).\n" +
		"`<service>` is `ranker`, `composer`, `console` or `archiver`, for the collectors several services share. Beside these,\n" +
		"each service exports Go's and the process's (`go_*`, `process_*`). What they are for:\n" +
		"[metrics.md](metrics.md).\n\n| metric | type | labels | meaning | defined in |\n|---|---|---|---|---|\n")
	for _, m := range metrics {
		fmt.Fprintf(&page, "| `%s` | %s | %s | %s | `%s` |\n", m.name, m.kind, strings.Join(m.labels, ", "), strings.ReplaceAll(m.help, "|", `\|`), m.where)
	}
	if len(metrics) < 30 {
		t.Fatalf("only %d metrics found in the code", len(metrics))
	}
	testenv.Golden(t, filepath.Join(root, "docs", "metrics-reference.md"), []byte(page.String()), *update,
		"go test ./internal/docs -run TestMetricsReference -update")
}

// metricsOf reads the collectors a file defines.
func metricsOf(path string) ([]metric, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	factories := factoriesOf(f)
	var out []metric
	ast.Inspect(f, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			if m, ok := metricOf(call, factories); ok {
				out = append(out, m)
			}
		}
		return true
	})
	return out, nil
}

// metricOf reads the collector a call defines, through a series factory (declared) or a
// prometheus.*Opts literal.
func metricOf(call *ast.CallExpr, factories map[string]string) (metric, bool) {
	if len(call.Args) == 0 {
		return metric{}, false
	}
	if m, ok := declared(call, factories); ok {
		return m, true
	}
	lit, ok := call.Args[0].(*ast.CompositeLit)
	if !ok {
		return metric{}, false
	}
	sel, ok := lit.Type.(*ast.SelectorExpr)
	if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
		return metric{}, false
	}
	if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" {
		return metric{}, false
	}
	m := metric{kind: strings.ToLower(strings.TrimSuffix(sel.Sel.Name, "Opts"))}
	var ns, name string
	for _, e := range lit.Elts {
		kv, ok := e.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key := kv.Key.(*ast.Ident).Name
		val := stringOf(kv.Value)
		switch key {
		case "Namespace":
			ns = val
		case "Name":
			name = val
		case "Help":
			m.help = val
		case "ConstLabels": // labels of one collector's own, each set where it is made
			if labels, ok := kv.Value.(*ast.CompositeLit); ok {
				for _, l := range labels.Elts {
					if lkv, ok := l.(*ast.KeyValueExpr); ok {
						m.labels = append(m.labels, stringOf(lkv.Key))
					}
				}
			}
		}
	}
	m.name = name
	if ns != "" {
		m.name = ns + "_" + name
	}
	if fn, ok := call.Fun.(*ast.SelectorExpr); ok && strings.HasSuffix(fn.Sel.Name, "Vec") && len(call.Args) > 1 {
		if labels, ok := call.Args[1].(*ast.CompositeLit); ok {
			for _, l := range labels.Elts {
				m.labels = append(m.labels, stringOf(l))
			}
		}
	}
	if fn, ok := call.Fun.(*ast.SelectorExpr); ok && strings.HasSuffix(fn.Sel.Name, "Func") {
		m.kind += " (func)"
	}
	return m, true
}

// factoriesOf finds the internal/series factories of a file: variables assigned from series.On
// (namespace from its Under, when there is one) and parameters of type series.Factory (the
// caller's namespace: <service>).
func factoriesOf(f *ast.File) map[string]string {
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch v := n.(type) {
		case *ast.AssignStmt:
			for i, rhs := range v.Rhs {
				if ns, ok := factoryOf(rhs, out); ok && i < len(v.Lhs) {
					out[v.Lhs[i].(*ast.Ident).Name] = ns
				}
			}
		case *ast.Field:
			if sel, ok := v.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Factory" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "series" {
					for _, name := range v.Names {
						out[name.Name] = "<service>"
					}
				}
			}
		}
		return true
	})
	return out
}

// factoryOf says whether e is a series factory, and its namespace.
func factoryOf(e ast.Expr, known map[string]string) (string, bool) {
	switch v := e.(type) {
	case *ast.Ident:
		ns, ok := known[v.Name]
		return ns, ok
	case *ast.CallExpr:
		fn, ok := v.Fun.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		if x, ok := fn.X.(*ast.Ident); ok && x.Name == "series" && fn.Sel.Name == "On" {
			return "", true
		}
		if fn.Sel.Name == "Under" && len(v.Args) == 1 {
			if _, ok := factoryOf(fn.X, known); ok {
				return stringOf(v.Args[0]), true
			}
		}
	}
	return "", false
}

// declared reads a series declared through a factory: f.Counter(name, help), f.CounterVec(name,
// help, labels...), f.Histogram(name, help, buckets), f.HistogramVec(name, help, buckets,
// labels...), and the same for gauges.
func declared(call *ast.CallExpr, factories map[string]string) (metric, bool) {
	fn, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || len(call.Args) < 2 {
		return metric{}, false
	}
	kind := strings.TrimSuffix(fn.Sel.Name, "Vec")
	if kind != "Counter" && kind != "Gauge" && kind != "Histogram" {
		return metric{}, false
	}
	ns, ok := factoryOf(fn.X, factories)
	if !ok {
		return metric{}, false
	}
	m := metric{kind: strings.ToLower(kind), name: stringOf(call.Args[0]), help: stringOf(call.Args[1])}
	if ns != "" {
		m.name = ns + "_" + m.name
	}
	if fn.Sel.Name != kind {
		labels := call.Args[2:]
		if kind == "Histogram" {
			labels = labels[1:]
		}
		for _, l := range labels {
			m.labels = append(m.labels, stringOf(l))
		}
	}
	return m, true
}

// stringOf is a string literal's value, or <service> for anything computed (the namespace of the
// service that runs the code).
func stringOf(e ast.Expr) string {
	switch v := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(v.Value); err == nil {
			return s
		}
	case *ast.BinaryExpr: // "a" + "b"
		return stringOf(v.X) + stringOf(v.Y)
	}
	return "<service>"
}
