package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/retry"
)

func TestBackoff(t *testing.T) {
	p := retry.Redelivery()
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i, w := range want {
		if got := p.Backoff(uint64(i + 1)); got != w {
			t.Errorf("Backoff(%d) = %s, want %s", i+1, got, w)
		}
	}
	if got := p.Backoff(0); got != want[0] {
		t.Errorf("Backoff(0) = %s, want the first pause %s", got, want[0])
	}
	if got := p.Backoff(1 << 62); got != p.Max {
		t.Errorf("Backoff(huge) = %s, want the cap %s", got, p.Max)
	}
}

// fast is a policy whose pauses cost the test nothing.
func fast(tries int) retry.Policy {
	return retry.Policy{Min: time.Microsecond, Max: time.Microsecond, Tries: tries}
}

func TestDo(t *testing.T) {
	errFlaky := errors.New("flaky")
	tests := []struct {
		name      string
		tries     int
		failFirst int  // the step fails this many times
		permanent bool // its failures are Stop errors
		wantCalls uint64
		wantErr   error
		wantHeard int // failures followed by a pause
	}{
		{name: "succeeds at once", failFirst: 0, wantCalls: 1},
		{name: "succeeds after failures", failFirst: 3, wantCalls: 4, wantHeard: 3},
		{name: "gives up after its tries", tries: 2, failFirst: 5, wantCalls: 2, wantErr: errFlaky, wantHeard: 1},
		{name: "a permanent error ends it", failFirst: 5, permanent: true, wantCalls: 1, wantErr: errFlaky},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls uint64
			heard := 0
			err := retry.Do(context.Background(), fast(tt.tries), func(try uint64, err error, _ time.Duration) {
				heard++
				if try != calls {
					t.Errorf("told of try %d after %d calls", try, calls)
				}
			}, func(_ context.Context, try uint64) error {
				calls++
				if try != calls {
					t.Errorf("step got try %d on call %d", try, calls)
				}
				if calls <= uint64(tt.failFirst) {
					if tt.permanent {
						return retry.Stop(errFlaky)
					}
					return errFlaky
				}
				return nil
			})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("Do = %v, want %v", err, tt.wantErr)
			}
			if calls != tt.wantCalls || heard != tt.wantHeard {
				t.Errorf("calls %d, failures heard %d; want %d and %d", calls, heard, tt.wantCalls, tt.wantHeard)
			}
		})
	}
}

func TestDoEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errDown := errors.New("down")
	calls := 0
	err := retry.Do(ctx, retry.Policy{Min: time.Hour, Max: time.Hour}, nil, func(context.Context, uint64) error {
		calls++
		cancel() // the pause after this failure would be an hour: the cancel must end it
		return errDown
	})
	if !errors.Is(err, errDown) || !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("Do = %v after %d calls, want the step's error and context.Canceled after 1", err, calls)
	}
}

func TestSleep(t *testing.T) {
	if err := retry.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := retry.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep on an ended context = %v, want context.Canceled", err)
	}
	if err := retry.Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep(0) on an ended context = %v, want context.Canceled", err)
	}
}

func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	runs := 0
	retry.Every(ctx, time.Microsecond, func(ctx context.Context) {
		if runs++; runs == 3 {
			cancel()
		}
	})
	if runs != 3 {
		t.Errorf("Every ran the step %d times, want 3 (the first at once, none after the cancel)", runs)
	}
}
