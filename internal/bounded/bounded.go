// Package bounded reads input that comes from outside (files and folders given to the CLI, standard
// input, archives, bundles handed over by someone else) with a limit checked while reading, never
// after: a reader never takes more than the limit and one byte, whatever the input claims or
// decompresses to, and a read past it ends with an error naming the input, the limit and the flag or
// setting that raises it (docs/security.md).
package bounded

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Limit is how much of one input is read at most, and what raises it.
type Limit struct {
	Bytes   int64
	Setting string // the flag or variable that raises it, for the error; empty: a fixed limit
}

// TooLargeError is an input over its limit.
type TooLargeError struct {
	What  string
	Limit Limit
}

func (e *TooLargeError) Error() string {
	if e.Limit.Setting == "" {
		return fmt.Sprintf("%s is larger than %d bytes, the limit", e.What, e.Limit.Bytes)
	}
	return fmt.Sprintf("%s is larger than %d bytes, the limit (raise it with %s)", e.What, e.Limit.Bytes, e.Limit.Setting)
}

// Reader reads r until the limit: past it, a read fails with a TooLargeError naming what.
func (l Limit) Reader(r io.Reader, what string) io.Reader {
	return &reader{r: r, left: l.Bytes, limit: l, what: what}
}

type reader struct {
	r     io.Reader
	left  int64
	limit Limit
	what  string
}

func (r *reader) Read(p []byte) (int, error) {
	if r.left < 0 {
		return 0, &TooLargeError{What: r.what, Limit: r.limit}
	}
	// One byte more than is left, so an input of exactly the limit ends with EOF, not an error
	// (compared without r.left+1, which a limit of math.MaxInt64 would overflow).
	if int64(len(p))-1 > r.left {
		p = p[:r.left+1]
	}
	n, err := r.r.Read(p)
	r.left -= int64(n)
	if r.left < 0 {
		return n + int(r.left), &TooLargeError{What: r.what, Limit: r.limit}
	}
	return n, err
}

// ReadAll reads all of r, at most the limit.
func (l Limit) ReadAll(r io.Reader, what string) ([]byte, error) {
	return io.ReadAll(l.Reader(r, what))
}

// ReadFile reads a file, at most the limit ("-" is standard input).
func (l Limit) ReadFile(path string) ([]byte, error) {
	if path == "-" {
		return l.ReadAll(os.Stdin, "standard input")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return l.ReadAll(f, path)
}

// ReadFS reads a file of a file system, at most the limit.
func (l Limit) ReadFS(fsys fs.FS, name, what string) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return l.ReadAll(f, what)
}

// IsTooLarge says whether err is an input over its limit.
func IsTooLarge(err error) bool {
	var e *TooLargeError
	return errors.As(err, &e)
}
