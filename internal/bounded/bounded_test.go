package bounded

import (
	"bytes"
	"io"
	"math"
	"testing"
	"testing/iotest"
)

// TestLimitIsCheckedWhileReading: an input of exactly the limit is read whole; one byte more ends
// with the error naming the input, the limit and its setting, having read no more than the limit and
// one byte, also from a reader that hands over one byte at a time.
func TestLimitIsCheckedWhileReading(t *testing.T) {
	l := Limit{Bytes: 10, Setting: "X_BYTES"}
	for _, half := range []bool{false, true} {
		src := func(n int) io.Reader {
			var r io.Reader = bytes.NewReader(bytes.Repeat([]byte("a"), n))
			if half {
				r = iotest.OneByteReader(r)
			}
			return r
		}
		if b, err := l.ReadAll(src(10), "input"); err != nil || len(b) != 10 {
			t.Errorf("exactly the limit: %d bytes, %v", len(b), err)
		}
		counted := &countingReader{r: src(1 << 20)}
		b, err := l.ReadAll(counted, "input")
		if !IsTooLarge(err) || err.Error() != "input is larger than 10 bytes, the limit (raise it with X_BYTES)" {
			t.Errorf("over the limit: %v", err)
		}
		if len(b) > 10 || counted.n > 11 {
			t.Errorf("over the limit: returned %d bytes, read %d from the input", len(b), counted.n)
		}
	}
	// The largest limit there is reads what there is.
	if b, err := (Limit{Bytes: math.MaxInt64}).ReadAll(bytes.NewReader([]byte("abc")), "input"); err != nil || string(b) != "abc" {
		t.Errorf("a limit of MaxInt64: %q, %v", b, err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
