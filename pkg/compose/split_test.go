package compose

import (
	"fmt"
	"testing"
)

// TestChoose: a split serves each version about its share of teams, the same team the same version
// every time, and a team served before keeps its version when the weights change, as long as the
// label gives it weight.
func TestChoose(t *testing.T) {
	split := Split{{Version: 5, Weight: 50}, {Version: 6, Weight: 50}}
	count := map[int]int{}
	for k := range 1000 {
		a := Assignment{ExecutionID: "e", TeamID: fmt.Sprintf("team-%d", k)}
		v, err := Choose(split, "team-round", "production", a)
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := Choose(split, "team-round", "production", a); again != v {
			t.Fatalf("team-%d: %d, then %d", k, v, again)
		}
		count[v]++
	}
	if count[5] < 450 || count[6] < 450 {
		t.Errorf("50/50 over 1000 teams: %v", count)
	}
	// 90/10: about a tenth.
	count = map[int]int{}
	for k := range 1000 {
		v, _ := Choose(Split{{5, 90}, {6, 10}}, "team-round", "production", Assignment{ExecutionID: "e", TeamID: fmt.Sprintf("team-%d", k)})
		count[v]++
	}
	if count[6] < 60 || count[6] > 140 {
		t.Errorf("90/10 over 1000 teams: %v", count)
	}
	// Sticky: the version served before stays while it has weight, whatever the hash says now.
	moved := 0
	for k := range 1000 {
		a := Assignment{ExecutionID: "e", TeamID: fmt.Sprintf("team-%d", k)}
		before, _ := Choose(split, "team-round", "production", a)
		a.Previous = before
		after, _ := Choose(Split{{5, 10}, {6, 90}}, "team-round", "production", a)
		if after != before {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d teams moved when the weights changed", moved)
	}
	// A version the label no longer gives weight: chosen again among those it does.
	if v, _ := Choose(Split{{6, 100}}, "team-round", "production", Assignment{ExecutionID: "e", TeamID: "t", Previous: 5}); v != 6 {
		t.Errorf("a team whose version left the split got %d", v)
	}
	if _, err := Choose(Split{{5, 0}}, "team-round", "production", Assignment{}); err == nil {
		t.Error("a split of no weight chose a version")
	}
}

// TestLabel: which registry label a reference resolves through, and its split when it has one.
func TestLabel(t *testing.T) {
	v := func(n int) Version {
		return Version{Name: "greet", Version: n, Files: map[string][]byte{"prompt.mustache": []byte(fmt.Sprintf("v%d {{team.name}}", n))}}
	}
	lib, errs := testLibrary(t).WithRegistry([]Version{v(1), v(2)}, map[string]map[string]int{"greet": {"staging": 1}})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	split := Split{{Version: 1, Weight: 50}, {Version: 2, Weight: 50}}
	lib = lib.WithSplits(map[string]map[string]Split{"greet": {"production": split}})
	for _, tt := range []struct {
		ref, label string
		split      bool
	}{
		{"greet", "production", true},
		{"greet:production", "production", true},
		{"greet:staging", "staging", false},
		{"greet@2", "", false},
		{"greet:latest", "", false},
		{"greet:nope", "", false},
		{"team-round", "", false},
	} {
		ref, err := lib.Reference(tt.ref)
		if err != nil {
			t.Fatal(err)
		}
		label, s := lib.Label(ref)
		if label != tt.label || (s != nil) != tt.split || tt.label != "" && ref.Name != "greet" {
			t.Errorf("Label(%q) = %q, %q, %v", tt.ref, ref.Name, label, s)
		}
	}
	if _, err := lib.Lookup("greet"); err == nil {
		t.Error("a split label was looked up without a team to choose for")
	}
}
