package panics_test

import (
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/panics"
)

func TestCatch(t *testing.T) {
	ran := false
	if p := panics.Catch(func() { ran = true }); p != nil || !ran {
		t.Errorf("Catch of a step that returns = %v (ran %v), want nil after running it", p, ran)
	}
	p := panics.Catch(func() { panic("bad row") })
	if p == nil {
		t.Fatal("Catch of a panicking step = nil, want the panic")
	}
	if p.Value != "bad row" || p.Error() != "panicked: bad row" {
		t.Errorf("Catch = %#v (%q), want the value bad row", p.Value, p.Error())
	}
	if !strings.Contains(p.Stack, "panics_test.TestCatch") {
		t.Errorf("the stack does not name where it panicked:\n%s", p.Stack)
	}
	var m map[string]int
	if p := panics.Catch(func() { m["x"]++ }); p == nil || !strings.Contains(p.Error(), "nil map") {
		t.Errorf("Catch of a runtime error = %v, want it named", p)
	}
}
