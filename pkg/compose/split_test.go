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
