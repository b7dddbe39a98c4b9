package chstore

import (
	"context"
	"errors"
	"fmt"
)

// A reader of the evaluations table (the ranker's API, the console, the podium CLI) reads it as a
// view of EVALUATIONS, never as a table that happens to hold rows: it takes the newest lineage
// first, which must be whole (no refill runs), reads anchored on that lineage's anchor (each read
// fails with ErrAnchorLost when the same query does not find the anchor row at its position: the
// table was emptied, dropped or made again since), and reads the lineage again after: the same
// derivation, still whole. A refill notes a lineage that is not whole before it writes its first
// row, and a rebuild notes a new epoch, so a read that overlapped either is refused. Every
// refusal is a *NotWholeError or wraps ErrAnchorLost: retryable, named, never a short answer.

// NotWholeError is a read refused because the store is not whole now.
type NotWholeError struct{ Why string }

func (e *NotWholeError) Error() string {
	return "the ranker's store is not whole now (" + e.Why + "): try again once the ranker is ready"
}

// Unwhole reports whether err is a read refused because the store was not whole (a
// *NotWholeError, or the anchor row missing): retryable, once the ranker has made it whole.
func Unwhole(err error) bool {
	var nw *NotWholeError
	return errors.As(err, &nw) || errors.Is(err, ErrAnchorLost)
}

// View is one anchored read of the store, from Begin to Confirm.
type View struct {
	Anchored
	lineage Lineage
}

// Begin starts a read: the store's newest lineage, whole, and the reads anchored on it.
func (s *Store) Begin(ctx context.Context) (*View, error) {
	lin, err := s.wholeLineage(ctx)
	if err != nil {
		return nil, err
	}
	return &View{Anchored: s.Anchored(lin.Anchor), lineage: lin}, nil
}

// Lineage is the lineage the view reads.
func (v *View) Lineage() Lineage { return v.lineage }

// Confirm reads the lineage again after the reads: nil when it is the one they were anchored on,
// still whole.
func (v *View) Confirm(ctx context.Context) error {
	lin, err := v.s.wholeLineage(ctx)
	if err != nil {
		return err
	}
	if lin.ID() != v.lineage.ID() {
		return &NotWholeError{Why: fmt.Sprintf("its lineage moved from %s to %s while it was read: refilled or rebuilt meanwhile", v.lineage.ID(), lin.ID())}
	}
	return nil
}

// wholeLineage is the newest lineage, which must be whole.
func (s *Store) wholeLineage(ctx context.Context) (Lineage, error) {
	lin, found, err := s.Lineage(ctx)
	switch {
	case FaultOf(err) == Missing:
		return Lineage{}, &NotWholeError{Why: "its tables are missing; the ranker makes them again and refills them"}
	case err != nil:
		return Lineage{}, err
	case !found:
		return Lineage{}, &NotWholeError{Why: "it has no lineage: no ranker has checked it against EVALUATIONS yet"}
	case !lin.Whole:
		return Lineage{}, &NotWholeError{Why: "a refill from EVALUATIONS is not finished"}
	}
	return lin, nil
}
