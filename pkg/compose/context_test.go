package compose

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// TestContextMatchesVariables checks that buildContext produces every variable the strictness
// check lets templates use (variables()), and nothing else, at every level of nesting: a name
// checked at load but never produced would render empty, and one produced but unknown could
// never be used.
func TestContextMatchesVariables(t *testing.T) {
	in := longTournament("team-round", 0)
	in.Request.MaxRounds = 10 // the optional values are produced only when they apply
	lim := defaultLimits()
	ctx := buildContext(in, lim, time.UTC, cuts{}, func(string) bool { return true })
	compareNode(t, "", variables(), ctx)
}

func compareNode(t *testing.T, path string, n *node, value any) {
	t.Helper()
	if n.open {
		if _, ok := value.(map[string]any); !ok {
			t.Errorf("%s: want an object of request values, got %T", path, value)
		}
		return
	}
	if n.fields == nil {
		if _, isMap := value.(map[string]any); isMap {
			t.Errorf("%s: a leaf in variables() but an object in the context", path)
		}
		return
	}
	if n.list {
		items, ok := value.([]any)
		if !ok || len(items) == 0 {
			t.Errorf("%s: want a non-empty list to compare its items, got %T (%v)", path, value, value)
			return
		}
		value = items[0]
	}
	m, ok := value.(map[string]any)
	if !ok {
		t.Errorf("%s: want an object, got %T", path, value)
		return
	}
	want := slices.Sorted(maps.Keys(n.fields))
	got := slices.Sorted(maps.Keys(m))
	if !slices.Equal(want, got) {
		t.Errorf("%s: variables() names %v, the context has %v", path, want, got)
	}
	for name, child := range n.fields {
		if v, ok := m[name]; ok {
			compareNode(t, path+"."+name, child, v)
		}
	}
}
