package audit

import "testing"

func TestTraceIDs(t *testing.T) {
	for _, tt := range []struct {
		in          string
		trace, span string
		ok          bool
	}{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true},
		{"", "", "", false},
		{"00-short-00f067aa0ba902b7-01", "", "", false},
	} {
		trace, span, ok := TraceIDs(tt.in)
		if trace != tt.trace || span != tt.span || ok != tt.ok {
			t.Errorf("TraceIDs(%q) = %q, %q, %v", tt.in, trace, span, ok)
		}
	}
}
