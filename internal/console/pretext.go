package console

import (
	"html/template"
	"strings"
)

// preText writes a text for the inside of a <pre> so that the browser's DOM holds exactly its
// bytes. html/template's escaping is right for every character but one: HTML parsing turns a
// carriage return (alone or before a line feed) into a line feed before anything else, so a
// prompt with "\r\n" would show, and copy, as a different text than was published. A character
// reference (&#13;) survives parsing. The text is escaped first with html/template's own escaper
// (& ' < > " and NUL), so the result holds no markup of the text's: this is the one place a
// team's or an evaluator's text becomes template.HTML, and TestPreTextRoundTrips parses it back.
// The template puts a line feed right after <pre> itself: the parser drops exactly one there, so
// a text that starts with one keeps it.
func preText(s string) template.HTML {
	escaped := template.HTMLEscapeString(s)
	if strings.IndexByte(escaped, '\r') >= 0 {
		escaped = strings.ReplaceAll(escaped, "\r", "&#13;")
	}
	return template.HTML(escaped) //nolint:gosec // escaped above; see the comment
}
