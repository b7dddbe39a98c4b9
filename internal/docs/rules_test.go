package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// named is an identifier a cell names in parentheses after a file: (`Latest`), (`State.For`: ...).
var named = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)?)`")

// TestRuleTableNamesWhatExists reads the "one rule, one file" table of docs/development.md: every
// Go file a row names exists (a bare file name is beside the file named before it), and every
// identifier it names in parentheses after a file (a function, a type, a method bare or as
// Type.Method, a variable or constant) is declared in that file.
func TestRuleTableNamesWhatExists(t *testing.T) {
	root := filepath.Join("..", "..")
	text, err := os.ReadFile(filepath.Join(root, "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(text), "| rule | the one place that holds it |")
	if !ok {
		t.Fatal(`docs/development.md has no "| rule | the one place that holds it |" table`)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	rows := 0
	for line := range strings.SplitSeq(table, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		rows++
		cells := strings.Split(line, " | ")
		place := cells[len(cells)-1]
		files := 0
		for _, file := range filesIn(place) {
			files++
			path := filepath.Join(root, filepath.FromSlash(file.path))
			decls, err := declarations(path)
			if err != nil {
				t.Errorf("rule %q names %s: %v", cells[0], file.path, err)
				continue
			}
			for _, name := range file.names {
				if !decls[name] {
					t.Errorf("rule %q names %s in %s, which declares no such function, type or method", cells[0], name, file.path)
				}
			}
		}
		if files == 0 {
			t.Errorf("rule %q names no Go file", cells[0])
		}
	}
	if rows < 10 {
		t.Fatalf("read %d rules from the table, want its rows", rows)
	}
}

type namedFile struct {
	path  string
	names []string // identifiers named in parentheses right after it
}

// filesIn are the files a cell names, each with the identifiers in the parentheses that follow it.
func filesIn(cell string) []namedFile {
	var out []namedFile
	locs := regexp.MustCompile("`([a-z][a-z0-9_/]*\\.go)`").FindAllStringSubmatchIndex(cell, -1)
	for i, loc := range locs {
		f := namedFile{path: cell[loc[2]:loc[3]]}
		if !strings.Contains(f.path, "/") && len(out) > 0 { // beside the file named before it
			f.path = path.Join(path.Dir(out[len(out)-1].path), f.path)
		}
		rest := cell[loc[1]:]
		if i+1 < len(locs) {
			rest = cell[loc[1]:locs[i+1][0]]
		}
		if strings.HasPrefix(strings.TrimSpace(rest), "(") {
			paren := strings.TrimSpace(rest)
			if end := strings.Index(paren, ")"); end > 0 {
				paren = paren[:end]
			}
			// Only what the parentheses name before a colon: after it, the words are prose.
			paren, _, _ = strings.Cut(paren, ":")
			for _, m := range named.FindAllStringSubmatch(paren, -1) {
				f.names = append(f.names, m[1])
			}
		}
		out = append(out, f)
	}
	return out
}

// declarations are the top-level functions and types of a Go file, and its methods as Type.Method.
func declarations(path string) (map[string]bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				out[d.Name.Name] = true
				continue
			}
			typ := d.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if idx, ok := typ.(*ast.IndexExpr); ok {
				typ = idx.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				out[id.Name+"."+d.Name.Name] = true
			}
			out[d.Name.Name] = true // a method named bare: the table names what a reader greps for
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					out[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						out[n.Name] = true
					}
				}
			}
		}
	}
	return out, nil
}
