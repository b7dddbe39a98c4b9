package compose

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/cbroglie/mustache"

	"github.com/podium-llm/podium/pkg/events"
)

// A render is bounded in work and in size before it starts and while it runs, whatever the
// template and the data: mustache.Render takes no context, and valid Mustache can multiply.
// Inside a round `history` resolves to the team's history again, so eight nested {{#history}}
// sections over 20 rounds are 20^8 iterations that write nothing until the innermost one.
//
// Two bounds together end every render:
//   - renderWork walks the tags with the values the render will see, as mustache does, and counts
//     each tag visited and each iteration of a section, stopping at MaxRenderSteps, and the bytes
//     the variables print, stopping at MaxRenderBytes. It sees what no writer can: iterations
//     that write nothing, and variables (mustache ignores their failed writes). Its own cost is
//     bounded by the same counts.
//   - boundedWriter takes at most MaxRenderBytes and ends with ctx. mustache stops a render on a
//     failed write of the template's text, so a render that writes ends soon after either.
const (
	// MaxRenderSteps is the most work one part's render may take. A real round prompt takes a
	// few thousand (a leaderboard of 1,000 teams with five fields is about 6,000); a walk of the
	// whole budget takes about 0.15 s of one core (TestRenderBoundedInWork).
	MaxRenderSteps = 4_000_000
	// MaxRenderBytes is the largest text one render may write: NATS's largest max_payload, so a
	// prompt larger could never be published whatever the server's configuration.
	MaxRenderBytes = 64 << 20
)

// errRenderTooLarge ends a render that wrote MaxRenderBytes.
var errRenderTooLarge = errors.New("render too large")

// workCheckEvery is how many steps the walk takes between looks at ctx.
const workCheckEvery = 4096

// renderWork counts the work of rendering tags with vals, up to MaxRenderSteps. It answers a
// budget_exceeded Failure past the bound, and ctx's error when ctx ends first. With checkVars it
// also finds the first variable that would render as nothing (absent) or as "<nil>" (null): a
// template_error. The same walk does both, so finding a missing variable is bounded too.
func renderWork(ctx context.Context, name string, tags []tagNode, vals map[string]any, checkVars bool) error {
	w := work{ctx: ctx, checkVars: checkVars}
	w.walk(tags, []any{vals})
	if w.err != nil {
		return w.err
	}
	if w.missing != "" {
		return events.Failf(events.CodeTemplateError, "template %q uses %q, which this request does not provide", name, w.missing)
	}
	if w.steps > MaxRenderSteps {
		return events.Failf(events.CodeBudgetExceeded,
			"template %q: rendering would take more than %d steps (sections nested over lists multiply their iterations)", name, MaxRenderSteps)
	}
	if w.bytes > MaxRenderBytes {
		return tooLarge(name)
	}
	return nil
}

// tooLarge is the answer to a render past MaxRenderBytes, found by the walk or by the writer.
func tooLarge(name string) error {
	return events.Failf(events.CodeBudgetExceeded, "template %q: the prompt would be larger than %d bytes, the largest message NATS takes", name, MaxRenderBytes)
}

type work struct {
	ctx       context.Context
	checkVars bool
	steps     int
	bytes     int    // what the variables print
	missing   string // the first variable with no value, under checkVars
	err       error  // ctx's, once it ended
}

// step charges one step; false once the walk must stop.
func (w *work) step() bool {
	if w.steps++; w.steps > MaxRenderSteps {
		return false
	}
	if w.steps%workCheckEvery == 0 {
		if err := w.ctx.Err(); err != nil {
			w.err = err
			return false
		}
	}
	return true
}

// tagNode is a mustache tag as renderWork reads it. mustache builds a section's Tags() anew on
// every call; a part keeps its tree from load instead.
type tagNode struct {
	typ      mustache.TagType
	name     string
	children []tagNode
}

func tagTree(tags []mustache.Tag) []tagNode {
	out := make([]tagNode, len(tags))
	for i, t := range tags {
		out[i] = tagNode{typ: t.Type(), name: t.Name()}
		if t.Type() == mustache.Section || t.Type() == mustache.InvertedSection {
			out[i].children = tagTree(t.Tags())
		}
	}
	return out
}

// walk visits tags as mustache renders them: a name is looked up from the innermost context out
// (lookupValue), a list's section renders once per item, another non-empty value's once with it
// pushed, an inverted section once when its value is empty.
func (w *work) walk(tags []tagNode, chain []any) bool {
	for _, tag := range tags {
		if !w.step() {
			return false
		}
		v, ok := lookupValue(chain, tag.name)
		switch tag.typ {
		case mustache.Variable:
			// Bytes are counted apart from steps: a long submission printed once is no work to
			// speak of, but printed in every iteration it is, and the writer cannot see it
			// (mustache ignores a variable's failed write).
			if w.checkVars && (!ok || v == nil) {
				w.missing = tag.name
				return false
			}
			if ok {
				if w.bytes += printedSize(v); w.bytes > MaxRenderBytes {
					return false
				}
			}
		case mustache.Section:
			if !ok || isEmpty(v) {
				continue
			}
			// One chain serves every item, as in mustache: this walk runs on every prompt.
			inner := make([]any, len(chain)+1)
			copy(inner[1:], chain)
			items, isList := iterated(v)
			if !isList {
				inner[0] = v
				if !w.walk(tag.children, inner) {
					return false
				}
				continue
			}
			for _, it := range items {
				inner[0] = it
				if !w.step() || !w.walk(tag.children, inner) {
					return false
				}
			}
		case mustache.InvertedSection:
			if ok && !isEmpty(v) {
				continue
			}
			if !w.walk(tag.children, chain) {
				return false
			}
		}
	}
	return true
}

// iterated is v's items when mustache iterates it: a slice or an array of any type.
func iterated(v any) ([]any, bool) {
	if items, ok := v.([]any); ok {
		return items, true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
		return nil, false
	}
	items := make([]any, rv.Len())
	for i := range items {
		items[i] = rv.Index(i).Interface()
	}
	return items, true
}

// printedSize is about how many bytes a variable prints: exact for the strings and numbers a
// context holds, and for a list or a map (only a request's vars can print one) at least one per
// element.
func printedSize(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case json.Number:
		return len(x)
	case int:
		return len(strconv.Itoa(x))
	case nil, bool, float64:
		return 8
	case map[string]any:
		n := 2
		for k, e := range x {
			n += len(k) + printedSize(e)
		}
		return n
	case []any:
		n := 2
		for _, e := range x {
			n += 1 + printedSize(e)
		}
		return n
	}
	return len(fmt.Sprint(v))
}

// boundedWriter keeps what a render writes up to MaxRenderBytes and refuses every write once ctx
// ended or the bound was passed. mustache ignores the error of a variable's write but stops on a
// text's; renderWork bounds the variables.
type boundedWriter struct {
	ctx    context.Context
	buf    strings.Builder // String() does not copy what it holds
	writes int
	err    error
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.writes++; b.writes%256 == 0 {
		if err := b.ctx.Err(); err != nil {
			b.err = err
			return 0, err
		}
	}
	if b.buf.Len()+len(p) > MaxRenderBytes {
		b.err = errRenderTooLarge
		return 0, b.err
	}
	return b.buf.Write(p)
}
