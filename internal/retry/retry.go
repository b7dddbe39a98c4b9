// Package retry is the one way a step that fails for a while is tried again, and the one way a
// loop waits: a Policy says how long to pause before each try (growing, capped) and how many tries
// there are; Do runs a step under it, Every runs a step on a period, Sleep is the pause that ends
// with the context. Every loop that retries or polls in the services uses it, so how they back off
// and how they stop is written once (Loki's backoff.Config and watermill's middleware.Retry are
// the models).
package retry

import (
	"context"
	"errors"
	"time"
)

// Policy is how a failing step is tried again.
type Policy struct {
	// Min is the pause after the first failure; it doubles with every failure after that.
	Min time.Duration
	// Max caps the pause.
	Max time.Duration
	// Tries bounds the tries of Do (0: until the context ends).
	Tries int
}

// Redelivery is the policy of transient failures in the services: 500ms, 1s, 2s, 4s, then 5s. A
// message that fails transiently is redelivered after it too (settle), so a fault costs the same
// pause whether the step retries in hand or the broker redelivers.
func Redelivery() Policy { return Policy{Min: 500 * time.Millisecond, Max: 5 * time.Second} }

// Backoff is the pause after the given failure (1-based): Min, doubled each time, at most Max.
func (p Policy) Backoff(failure uint64) time.Duration {
	if failure < 1 {
		failure = 1
	}
	d := p.Min
	for i := uint64(1); i < failure && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max)
}

// Sleep waits d, or until ctx ends; it returns ctx's error then.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// permanent marks an error that no retry can help.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Stop wraps an error of a step that must not be tried again: Do returns err at once.
func Stop(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// Failed is told of every failure of a step before the pause: the try (1-based), the error and
// the pause before the next try.
type Failed func(try uint64, err error, pause time.Duration)

// Do runs step until it succeeds, returns an error wrapped by Stop, p.Tries have failed, or ctx
// ends. It returns nil on success; otherwise the last error (the one given to Stop unwrapped),
// joined with ctx's error when the context ended it. failed (may be nil) hears of every failure
// that is followed by a pause.
func Do(ctx context.Context, p Policy, failed Failed, step func(ctx context.Context, try uint64) error) error {
	for try := uint64(1); ; try++ {
		err := step(ctx, try)
		if err == nil {
			return nil
		}
		var stop permanent
		if errors.As(err, &stop) {
			return stop.err
		}
		if ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		if p.Tries > 0 && try >= uint64(p.Tries) {
			return err
		}
		pause := p.Backoff(try)
		if failed != nil {
			failed(try, err, pause)
		}
		if cerr := Sleep(ctx, pause); cerr != nil {
			return errors.Join(err, cerr)
		}
	}
}

// Every runs step now and then every period until ctx ends. A step that takes longer than the
// period is followed by the next at once, never by two.
func Every(ctx context.Context, period time.Duration, step func(ctx context.Context)) {
	EveryOr(ctx, period, nil, step)
}

// EveryOr is Every, stepping at once too whenever wake delivers (nil: never).
func EveryOr(ctx context.Context, period time.Duration, wake <-chan struct{}, step func(ctx context.Context)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for ctx.Err() == nil {
		step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}
