package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// labelValues is what the code says of a series' labels: the values passed for each (by the
// label's place), and whether some value is not a literal (open: then any string the code spells
// may be one).
type labelValues struct {
	labels []string
	values []map[string]bool
	open   []bool
}

// codeLabels reads, from every non-test Go file under cmd, internal and pkg, the series declared
// into a struct field (field: f.CounterVec(...), or x.field = ...) and the values each
// WithLabelValues call on that field of the same package passes; and every string literal the code
// spells.
func codeLabels(t *testing.T, root string) (map[string]*labelValues, map[string]bool) {
	t.Helper()
	type fieldKey struct{ dir, field string }
	type use struct {
		key  fieldKey
		args []ast.Expr
	}
	fields := map[fieldKey][]metric{}
	var all []metric // every series declared, in a field or not
	var uses []use
	literals := map[string]bool{}
	for _, dir := range []string{"cmd", "internal", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			pkg := filepath.Dir(path)
			factories := factoriesOf(f)
			ast.Inspect(f, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok {
					if m, ok := metricOf(call, factories); ok {
						all = append(all, m)
					}
				}
				return true
			})
			declare := func(field string, e ast.Expr) {
				if call, ok := e.(*ast.CallExpr); ok {
					if m, ok := metricOf(call, factories); ok {
						k := fieldKey{pkg, field}
						fields[k] = append(fields[k], m)
					}
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch v := n.(type) {
				case *ast.BasicLit:
					if s, err := strconv.Unquote(v.Value); err == nil && v.Kind == token.STRING {
						literals[s] = true
					}
				case *ast.KeyValueExpr:
					if k, ok := v.Key.(*ast.Ident); ok {
						declare(k.Name, v.Value)
					}
				case *ast.AssignStmt:
					for i, lhs := range v.Lhs {
						if sel, ok := lhs.(*ast.SelectorExpr); ok && i < len(v.Rhs) {
							declare(sel.Sel.Name, v.Rhs[i])
						}
					}
				case *ast.CallExpr:
					fn, ok := v.Fun.(*ast.SelectorExpr)
					if !ok || fn.Sel.Name != "WithLabelValues" {
						return true
					}
					if sel, ok := fn.X.(*ast.SelectorExpr); ok {
						uses = append(uses, use{fieldKey{pkg, sel.Sel.Name}, v.Args})
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	series := map[string]*labelValues{}
	for _, m := range all {
		if len(m.labels) == 0 {
			continue
		}
		lv := &labelValues{labels: m.labels, values: make([]map[string]bool, len(m.labels)), open: make([]bool, len(m.labels))}
		for i := range lv.values {
			lv.values[i] = map[string]bool{}
		}
		series[m.name] = lv
	}
	used := map[string]bool{}
	for _, u := range uses {
		for _, m := range fields[u.key] {
			lv := series[m.name]
			if lv == nil || len(u.args) != len(lv.labels) {
				continue
			}
			used[m.name] = true
			for i, a := range u.args {
				if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					lv.values[i][s] = true
				} else {
					lv.open[i] = true
				}
			}
		}
	}
	for name, lv := range series {
		if !used[name] {
			// Given its values elsewhere (a vector handed to another package, a label set by
			// a collector's own code): any string the code spells may be one.
			for i := range lv.open {
				lv.open[i] = true
			}
		}
	}
	return series, literals
}

// TestDocsNameLabelValuesThatExist: every label a doc or the shipped alerts and dashboards give a
// series is one of its labels as the code declares it, and every value given is one the code
// passes for that label (where the code passes only literals for it), or at least a string the
// code spells (where some value is computed). A doc that says `composer_store_reads_total{result="x"}`
// for an x the composer never counts, or an alert that matches a value no longer used (an alert that
// can never fire), fails here.
func TestDocsNameLabelValuesThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	series, literals := codeLabels(t, root)
	if len(series) < 10 {
		t.Fatalf("only %d labelled series found in the code", len(series))
	}
	lookup := func(name string) *labelValues {
		if lv := series[name]; lv != nil {
			return lv
		}
		if _, rest, ok := strings.Cut(name, "_"); ok {
			return series["<service>_"+rest] // a series every service has, named for one
		}
		return nil
	}
	// The labels Prometheus adds (a scrape's, a histogram's), never the code's.
	scraped := map[string]bool{"instance": true, "job": true, "le": true, "quantile": true}
	matcher := regexp.MustCompile(`((?:ranker|composer|archiver|console|<service>)_[a-z_]+)\{([^}]*)\}`)
	item := regexp.MustCompile(`^\s*([a-z_]+)\s*(?:(=~|!~|!=|=)\s*"?([^"]*)"?)?\s*$`)
	var files []string
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, docs...)
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"), filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	dashboards, _ := filepath.Glob(filepath.Join(root, "deploy", "grafana", "dashboards", "*.json"))
	files = append(files, dashboards...)
	checked := 0
	for _, file := range files {
		if filepath.Base(file) == "metrics-reference.md" {
			continue
		}
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range matcher.FindAllStringSubmatch(strings.ReplaceAll(string(text), `\"`, `"`), -1) {
			name := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(m[1], "")
			lv := lookup(name)
			if lv == nil {
				t.Errorf("%s gives labels to %s, which the code declares without labels (or not at all)", filepath.Base(file), m[1])
				continue
			}
			for _, part := range strings.Split(m[2], ",") {
				it := item.FindStringSubmatch(part)
				if it == nil {
					continue // not a matcher (a sentence in braces)
				}
				label, op, value := it[1], it[2], it[3]
				if scraped[label] {
					continue
				}
				at := slices.Index(lv.labels, label)
				if at < 0 {
					t.Errorf("%s: %s has no label %q (the code declares %v)", filepath.Base(file), m[1], label, lv.labels)
					continue
				}
				checked++
				if op == "" || strings.Contains(value, "$") || op == "!=" || op == "!~" {
					continue // the label alone, a dashboard's variable, or a negation
				}
				for _, v := range strings.Split(value, "|") {
					if v == "" || v == ".*" || v == ".+" {
						continue
					}
					if lv.open[at] && literals[v] || !lv.open[at] && lv.values[at][v] {
						continue
					}
					t.Errorf("%s: %s{%s=%q}: no code passes %q for that label", filepath.Base(file), m[1], label, v, v)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d labels checked: the docs' matchers were not found", checked)
	}
}
