package main

import "testing"

// TestArityOfEveryCommand: the argument counts read from each usage line of the table are the
// ones each command takes (written out here by hand), so a usage line that changes its words
// changes the rule only where this test agrees.
func TestArityOfEveryCommand(t *testing.T) {
	const alternatives = -2
	want := map[string][2]int{
		"templates push": {1, 1}, "templates list": {0, 0}, "templates show": {1, 1}, "templates history": {1, 1},
		"templates diff": {2, 2}, "templates label": {3, -1}, "templates render": {1, 1}, "templates try": {1, 1},
		"templates compare": {1, 1}, "templates import-mixseek": {1, 1},
		"builders push": {1, 1}, "builders label": {3, 3}, "builders list": {0, 0}, "builders parse": {1, 1},
		"prompts show": {3, 3}, "prompts verify": {alternatives}, "prompts diff": {4, 4}, "prompts tail": {0, 0},
		"audit check": {0, 0}, "audit keygen": {1, 1},
		"export": {0, 0}, "leaderboard": {1, 1}, "history": {2, 2}, "publish evaluation": {0, 0}, "publish round": {0, 0},
		"deadletters list": {0, 0}, "deadletters replay": {alternatives}, "store status": {0, 0}, "streams apply": {0, 0}, "store rebuild": {0, 0}, "store accept-loss": {0, 0},
	}
	cmds := commands()
	if len(cmds) != len(want) {
		t.Fatalf("%d commands, %d expected: add the new one here", len(cmds), len(want))
	}
	for _, c := range cmds {
		w, ok := want[c.name]
		if !ok {
			t.Fatalf("%s: not in the test", c.name)
		}
		least, most, alt := arityOf(c.args)
		if w[0] == alternatives {
			if !alt {
				t.Errorf("%s %q: read as %d..%d arguments, want alternatives", c.name, c.args, least, most)
			}
			continue
		}
		if alt || least != w[0] || most != w[1] {
			t.Errorf("%s %q: read as %d..%d (alternatives %v), want %d..%d", c.name, c.args, least, most, alt, w[0], w[1])
		}
	}
	// The check itself: too few, too many, and any number where most is open.
	show, _ := find(cmds, "templates show")
	label, _ := find(cmds, "templates label")
	for _, tc := range []struct {
		c    command
		args []string
		ok   bool
	}{
		{show, nil, false}, {show, []string{"a"}, true}, {show, []string{"a", "b"}, false},
		{label, []string{"a", "1"}, false}, {label, []string{"a", "1", "l"}, true}, {label, []string{"a", "1=50", "2=50", "l"}, true},
	} {
		if err := tc.c.checkArgs(tc.args); (err == nil) != tc.ok {
			t.Errorf("%s %v: error %v, want ok %v", tc.c.name, tc.args, err, tc.ok)
		}
	}
}
