package compose

import (
	"fmt"
	"strings"

	"github.com/podium-llm/podium/pkg/events"
)

// checkRelativePaths rejects a request whose vars hold, under a name the template declares as
// workspace paths, an absolute path or one that climbs out with "..": files are named relative
// to the workspace, never inlined and never outside it.
func checkRelativePaths(vars map[string]any, names []string) error {
	for _, name := range names {
		v, ok := lookupValue([]any{map[string]any(vars)}, name)
		if !ok || v == nil {
			continue
		}
		items, isList := v.([]any)
		if !isList {
			items = []any{v}
		}
		for i, it := range items {
			where := "vars." + name
			if isList {
				where = fmt.Sprintf("%s[%d]", where, i)
			}
			s, isString := it.(string)
			if !isString {
				return events.Failf(events.CodeInvalidRequest, "%s must be a path string, got %s", where, events.JSONKind(it))
			}
			if problem := relativePathProblem(s); problem != "" {
				return events.Failf(events.CodeInvalidRequest, "%s %q %s", where, s, problem)
			}
		}
	}
	return nil
}

func relativePathProblem(p string) string {
	switch {
	case p == "":
		return "is empty; name a file relative to the workspace"
	case strings.HasPrefix(p, "/") || strings.HasPrefix(p, `\`) || len(p) >= 2 && p[1] == ':':
		return "is absolute; name it relative to the workspace (like src/main.go)"
	}
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg == ".." {
			return "climbs out of the workspace with \"..\"; name it relative to the workspace"
		}
	}
	return ""
}
