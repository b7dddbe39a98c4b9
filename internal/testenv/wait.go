package testenv

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds and fails the test when it does not within limit. cond
// returns whether the condition holds and, when not, what it sees instead (for the failure). It
// is how tests wait: on something observable, never a fixed sleep. The poll starts at 5 ms and
// doubles to 100 ms, so a fast condition is seen fast and a slow one costs little.
func WaitFor(tb testing.TB, limit time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	pause := 5 * time.Millisecond
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("waited %s for %s; last seen: %s", limit, what, seen)
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}
