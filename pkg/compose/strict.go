package compose

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cbroglie/mustache"
)

// node describes what a template variable holds, so templates can be checked before any request
// arrives. A list node's fields are those of its items.
type node struct {
	fields   map[string]*node
	list     bool
	open     bool // "vars": known only per request, checked at render time
	optional bool // may be absent: usable only inside a section of its own name
}

func leaf() *node                     { return &node{} }
func object(f map[string]*node) *node { return &node{fields: f} }
func listOf(f map[string]*node) *node { return &node{fields: f, list: true} }
func optionalOf(n *node) *node        { n.optional = true; return n }
func leaves(names ...string) map[string]*node {
	m := make(map[string]*node, len(names))
	for _, n := range names {
		m[n] = leaf()
	}
	return m
}

// variables is the schema of docs/prompts.md: every name a template may use.
func variables() *node {
	root := leaves("user_prompt", "round_number", "is_first_round", "has_history", "has_leaderboard",
		"current_datetime", "trend", "submission_history", "ranking_table", "team_position_message")
	root["max_rounds"] = optionalOf(leaf())
	root["rounds_remaining"] = optionalOf(leaf())
	root["team"] = object(leaves("id", "name"))
	movement := []string{"movement", "movement_places", "moved_up", "moved_down", "unchanged", "is_new"}
	root["self"] = optionalOf(object(leaves(append([]string{"position", "rank", "best_score_text", "gap_to_leader_text", "team_count"}, movement...)...)))
	history := leaves("round_number", "score", "score_text", "feedback", "submission", "preview",
		"preview_truncated", "delta", "has_delta")
	history["metrics"] = listOf(leaves("metric_name", "score", "score_text", "evaluator_comment"))
	root["history"] = listOf(history)
	root["leaderboard"] = listOf(leaves(append([]string{"position", "rank", "team_id", "team_name", "best_score",
		"best_score_text", "best_round", "rounds", "is_self"}, movement...)...))
	root["vars"] = &node{open: true}
	return object(root)
}

// scope is one level of the context chain while checking: a section's name and what it pushed.
type scope struct {
	name string
	n    *node // nil: a scalar was pushed, it has no fields
}

// checkTags reports every tag of a template that names a variable the composer does not
// provide, or an optional one outside a section of its own name, with the line it is on.
func checkTags(name, src string, tags []mustache.Tag, root *node) error {
	var errs []error
	var walk func(tags []mustache.Tag, scopes []scope)
	walk = func(tags []mustache.Tag, scopes []scope) {
		for _, tag := range tags {
			switch tag.Type() {
			case mustache.Partial:
				errs = append(errs, fmt.Errorf("template %q line %d: partial %q was not expanded at load", name, tagLine(src, tag.Name()), tag.Name()))
				continue
			}
			n, problem := resolve(tag.Name(), scopes, tag.Type() != mustache.Variable)
			if problem != "" {
				errs = append(errs, fmt.Errorf("template %q line %d: %s", name, tagLine(src, tag.Name()), problem))
				continue
			}
			switch tag.Type() {
			case mustache.Section:
				walk(tag.Tags(), append(scopes, scope{name: tag.Name(), n: n}))
			case mustache.InvertedSection:
				// An inverted section renders with the context it is in.
				walk(tag.Tags(), append(scopes, scope{name: tag.Name(), n: &node{fields: map[string]*node{}}}))
			}
		}
	}
	walk(tags, []scope{{n: root}})
	return errors.Join(errs...)
}

// resolve finds what name refers to from the innermost scope outwards, as mustache looks it up.
func resolve(name string, scopes []scope, isSection bool) (*node, string) {
	if name == "." {
		if len(scopes) == 1 {
			return nil, `"." is only meaningful inside a section`
		}
		return scopes[len(scopes)-1].n, ""
	}
	parts := strings.Split(name, ".")
	var n *node
	var at int
	for at = len(scopes) - 1; at >= 0; at-- {
		s := scopes[at].n
		if s == nil {
			continue
		}
		if s.open {
			return &node{open: true}, "" // inside a vars section anything may resolve
		}
		if f, ok := s.fields[parts[0]]; ok {
			n = f
			break
		}
	}
	if n == nil {
		return nil, fmt.Sprintf("unknown variable %q", name)
	}
	if n.optional && at == 0 && !insideSectionNamed(parts[0], scopes) && !(isSection && len(parts) == 1) {
		return nil, fmt.Sprintf("optional variable %q may be used only inside {{#%s}}...{{/%s}}", name, parts[0], parts[0])
	}
	for i, p := range parts[1:] {
		if n.open {
			return n, ""
		}
		if n.list {
			return nil, fmt.Sprintf("variable %q: %q is a list; iterate it with a section", name, strings.Join(parts[:i+1], "."))
		}
		f, ok := n.fields[p]
		if !ok {
			return nil, fmt.Sprintf("unknown variable %q", name)
		}
		n = f
	}
	return n, ""
}

func insideSectionNamed(name string, scopes []scope) bool {
	for _, s := range scopes[1:] {
		if s.name == name {
			return true
		}
	}
	return false
}

// tagLine finds the line of the first tag naming name, for error messages; 0 when not found.
// It scans instead of building a regexp from the name, which may be any bytes (even invalid
// UTF-8) in a template that is being rejected.
func tagLine(src, name string) int {
	for at := 0; ; {
		i := strings.Index(src[at:], "{{")
		if i < 0 {
			return 0
		}
		start := at + i
		rest := strings.TrimPrefix(src[start+2:], "{")
		rest = strings.TrimLeft(rest, " \t\r\n")
		if rest != "" && strings.ContainsRune("#^/&>", rune(rest[0])) {
			rest = strings.TrimLeft(rest[1:], " \t\r\n")
		}
		if after, ok := strings.CutPrefix(rest, name); ok && strings.HasPrefix(strings.TrimLeft(after, " \t\r\n"), "}}") {
			return strings.Count(src[:start], "\n") + 1
		}
		at = start + 2
	}
}

// lookupValue resolves a possibly dotted name against a chain of values, innermost first.
func lookupValue(chain []any, name string) (any, bool) {
	if name == "." {
		return chain[0], true
	}
	first, rest, dotted := strings.Cut(name, ".")
	for _, c := range chain {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		v, found := m[first]
		if !found {
			continue
		}
		if !dotted {
			return v, true
		}
		return lookupValue([]any{v}, rest)
	}
	return nil, false
}

// isEmpty is mustache's notion of a falsy section value for the types a context holds.
func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return strings.TrimSpace(x) == ""
	case json.Number:
		return strings.TrimSpace(string(x)) == ""
	case int:
		return x == 0
	case float64:
		return x == 0
	case []any:
		return len(x) == 0
	}
	return false
}
