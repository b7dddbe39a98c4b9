package auditlog

import (
	"testing"
	"time"
)

// TestOffersAreOfOneStream: a leaf offered from one PROMPTS is never taken for another made since
// (their sequences start again at 1), and offers of a stream deleted since are dropped.
func TestOffersAreOfOneStream(t *testing.T) {
	var o offers
	old, remade := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	a, b := LeafHash(1, "s", []byte("old")), LeafHash(1, "s", []byte("new"))
	o.put(old, 1, a)
	if _, ok := o.take(remade, 1); ok {
		t.Fatal("an offer of the old stream was taken for the one made again")
	}
	o.put(remade, 1, b)
	o.put(old, 2, a) // in flight from the old stream: dropped
	if got, ok := o.take(remade, 1); !ok || got != b {
		t.Fatalf("the new stream's offer: %v %v", got, ok)
	}
	if _, ok := o.take(remade, 2); ok {
		t.Fatal("an offer of the deleted stream was taken")
	}
	o.put(remade, 3, b)
	o.put(remade, 4, b)
	o.forget(remade, 3)
	if _, ok := o.take(remade, 3); ok {
		t.Fatal("an offer at or below the tree's size was kept")
	}
	if _, ok := o.take(remade, 4); !ok {
		t.Fatal("an offer above the tree's size was forgotten")
	}
}
