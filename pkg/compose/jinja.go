package compose

import (
	"fmt"
	"regexp"
	"strings"
)

// FromJinja converts a template of the Jinja2 subset mixseek-core's prompt templates use into
// this package's Mustache: {{ var }} placeholders of the variables docs/prompts.md names, and the
// blocks {% if round_number > 1 %}, {% if ranking_table %}, {% else %} and {% endif %}. Anything
// else is refused with its line and construct: a silent approximation would change prompts.
//
// The result renders byte for byte what Jinja2 renders with mixseek-core's Environment
// (autoescape=False, undefined=StrictUndefined, otherwise Jinja2's defaults: trim_blocks,
// lstrip_blocks and keep_trailing_newline all False). Three rules differ from Mustache's:
//   - Jinja2 reads every line end of the template (\r\n, \r, \n) as \n and drops one final
//     newline: the converted source is written that way;
//   - a block tag alone on its line leaves the line's indentation and newline in Jinja2, where
//     Mustache's standalone rule removes the whole line: such an if or endif is preceded by an
//     empty comment {{!}}, since a tag that is not the first on its line is never standalone
//     (an else becomes two tags already);
//   - whitespace around inline tags is kept by both.
func FromJinja(src string) (string, error) {
	src = jinjaNewline.Replace(src)
	src = strings.TrimSuffix(src, "\n")
	if loc := jinjaComment.FindStringIndex(src); loc != nil {
		return "", fmt.Errorf("line %d: Jinja2 comments {# #} are not converted", strings.Count(src[:loc[0]], "\n")+1)
	}
	var out strings.Builder
	var open []string // the Mustache section each open {% if %} became
	last := 0
	for _, m := range jinjaTag.FindAllStringSubmatchIndex(src, -1) {
		out.WriteString(src[last:m[0]])
		last = m[1]
		line := strings.Count(src[:m[0]], "\n") + 1
		tag := src[m[0]:m[1]]
		inner := ""
		if m[2] >= 0 {
			inner = strings.TrimSpace(src[m[2]:m[3]])
		} else {
			inner = strings.TrimSpace(src[m[4]:m[5]])
		}
		if strings.HasPrefix(tag, "{%-") || strings.HasSuffix(tag, "-%}") {
			return "", fmt.Errorf("line %d: %s uses whitespace control, which is not converted", line, tag)
		}
		if strings.HasPrefix(tag, "{{") {
			if !jinjaVariable.MatchString(inner) {
				return "", fmt.Errorf("line %d: %s is not a plain variable (filters, expressions and attributes are not converted)", line, tag)
			}
			fmt.Fprintf(&out, "{{%s}}", inner)
			continue
		}
		// An else becomes two tags, never standalone; an if or endif alone on its line must
		// keep the line as Jinja2 does.
		if inner != "else" && standalone(out.String(), src[m[1]:]) {
			out.WriteString(keepLine)
		}
		switch fields := strings.Fields(inner); {
		case inner == "if round_number > 1":
			open = append(open, "is_first_round")
			out.WriteString("{{^is_first_round}}")
		case inner == "if ranking_table":
			open = append(open, "ranking_table")
			out.WriteString("{{#ranking_table}}")
		case inner == "else" && len(open) > 0:
			name := open[len(open)-1]
			if name == "is_first_round" {
				fmt.Fprintf(&out, "{{/%s}}{{#%s}}", name, name)
			} else {
				fmt.Fprintf(&out, "{{/%s}}{{^%s}}", name, name)
			}
		case inner == "endif" && len(open) > 0:
			fmt.Fprintf(&out, "{{/%s}}", open[len(open)-1])
			open = open[:len(open)-1]
		default:
			construct := tag
			if len(fields) > 0 {
				construct = fields[0]
			}
			return "", fmt.Errorf("line %d: %s is not converted (only if round_number > 1, if ranking_table, else and endif are; construct %q)", line, tag, construct)
		}
	}
	if len(open) > 0 {
		return "", fmt.Errorf("an {%% if %%} is not closed by {%% endif %%}")
	}
	out.WriteString(src[last:])
	return out.String(), nil
}

// keepLine, before a block tag, keeps Mustache from treating the tag's line as standalone: the
// comment is the line's first tag, followed by another, so neither is alone on the line.
const keepLine = "{{!}}"

// standalone reports whether a block tag written after out, and followed by rest, would be
// alone on its line for Mustache: only spaces and tabs before it on its line, and after it up
// to the line's end.
func standalone(out, rest string) bool {
	before := out[strings.LastIndexByte(out, '\n')+1:]
	after, _, _ := strings.Cut(rest, "\n")
	return strings.Trim(before, " \t") == "" && strings.Trim(after, " \t") == ""
}

// jinjaNewline is how Jinja2's lexer reads line ends: all of them as \n.
var jinjaNewline = strings.NewReplacer("\r\n", "\n", "\r", "\n")

var (
	jinjaTag      = regexp.MustCompile(`(?s)\{\{(.*?)\}\}|\{%(.*?)%\}`)
	jinjaVariable = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	jinjaComment  = regexp.MustCompile(`\{#`)
)
