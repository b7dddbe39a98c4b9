package console

import (
	"bytes"
	"html/template"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// TestPreTextRoundTrips renders texts into a <pre> as the pages do and parses the page as a
// browser would: the element's text is the text, byte for byte, and no element came of it.
func TestPreTextRoundTrips(t *testing.T) {
	page := template.Must(template.New("p").Funcs(template.FuncMap{"pre": preText}).Parse("<!doctype html><body><pre id=\"p\">\n{{pre .}}</pre></body>"))
	for _, text := range []string{
		"plain",
		"\nstarts with a line feed",
		"\n\ntwo",
		"crlf\r\nline\rcr\n",
		"\r\n",
		`<script>alert(1)</script>"><img src=x onerror=alert(2)> & &amp; &#13; javascript:alert(3)`,
		"</pre><b>escaped</b>",
		"tab\tand unicode 日本語 \u2028 é",
		strings.Repeat("x\r\n", 1000),
	} {
		var buf bytes.Buffer
		if err := page.Execute(&buf, text); err != nil {
			t.Fatal(err)
		}
		doc, err := html.Parse(&buf)
		if err != nil {
			t.Fatal(err)
		}
		pre := find(doc, "pre")
		if pre == nil {
			t.Fatalf("%q: no <pre>", text)
		}
		var got strings.Builder
		for c := pre.FirstChild; c != nil; c = c.NextSibling {
			if c.Type != html.TextNode {
				t.Fatalf("%q made an element <%s> in the <pre>", text, c.Data)
			}
			got.WriteString(c.Data)
		}
		if got.String() != text {
			t.Errorf("%q came back as %q", text, got.String())
		}
	}
}

func find(n *html.Node, tag string) *html.Node {
	if n.Type == html.ElementNode && n.Data == tag {
		return n
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := find(c, tag); f != nil {
			return f
		}
	}
	return nil
}
