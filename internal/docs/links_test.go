// Package docs holds the tests of the repository's documentation: every relative link and anchor
// in README.md and docs/ resolves.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// anchors are the GitHub anchors of a Markdown file's headings: lower case, punctuation but - and _
// dropped, spaces made hyphens, repeats numbered.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		m := heading.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+string(rune('0'+n))] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestLinksResolve checks every relative link of README.md and docs/*.md: the file exists, and an
// anchor names a heading of it.
func TestLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "schemas", "README.md"), filepath.Join(root, "deploy", "README.md"))
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		// Links inside code blocks are examples, not links.
		var prose strings.Builder
		inFence := false
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "```") {
				inFence = !inFence
				continue
			}
			if !inFence {
				prose.WriteString(line + "\n")
			}
		}
		for _, m := range link.FindAllStringSubmatch(prose.String(), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %s: %v", rel(root, f), target, err)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			db, err := os.ReadFile(dest)
			if err != nil {
				t.Errorf("%s: link %s: anchor into %s, which is not a file", rel(root, f), target, rel(root, dest))
				continue
			}
			if !anchors(string(db))[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", rel(root, f), target, rel(root, dest), anchor)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d links checked: the test reads nothing", checked)
	}
}

// TestCodeCitesAnchorsThatExist: a Go comment that cites docs/<page>.md#<anchor> names a heading
// that exists.
func TestCodeCitesAnchorsThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	cite := regexp.MustCompile(`docs/([a-z-]+\.md)#([a-z0-9-]+)`)
	n := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range cite.FindAllStringSubmatch(string(b), -1) {
			n++
			page, err := os.ReadFile(filepath.Join(root, "docs", m[1]))
			if err != nil || !anchors(string(page))[m[2]] {
				t.Errorf("%s cites docs/%s#%s, which does not exist", rel(root, path), m[1], m[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("no Go comment cites the docs: the test reads nothing")
	}
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}
