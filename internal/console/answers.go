package console

import (
	"bytes"
	"errors"
	"math"

	"github.com/go-json-experiment/json/jsontext"
)

// A grid needs four fields of each PROMPTS record, whose body is mostly the prompt: decoding it
// whole (encoding/json validates every byte, then decodes) was 60% of the CPU of a console's
// first page of a 100 x 20 execution. jsontext (the token layer of Go's coming encoding/json/v2,
// kept by the Go team as github.com/go-json-experiment/json) reads the record once and skips
// what is not asked for without allocating it.

// answer is what the grid reads of a prompt.composed or prompt.failed.
type answer struct {
	TeamID string
	Round  int
	Tokens int
	Cuts   int
	Code   string
}

var errNotAnAnswer = errors.New("not an answer record")

// answerReader reads answers one after another with one decoder, whose buffer is kept
// between records (a decoder per record copied every body into a buffer of its own).
type answerReader struct {
	dec *jsontext.Decoder
	in  bytes.Reader
}

func newAnswerReader() *answerReader {
	r := &answerReader{}
	r.dec = jsontext.NewDecoder(&r.in)
	return r
}

// read reads the data fields of an answer, skipping the rest of the CloudEvent.
func (r *answerReader) read(body []byte) (answer, error) {
	var a answer
	r.in.Reset(body)
	r.dec.Reset(&r.in)
	dec := r.dec
	if err := object(dec, func(name string) error {
		if name != "data" || dec.PeekKind() != '{' {
			return dec.SkipValue()
		}
		return object(dec, func(field string) error {
			var err error
			switch field {
			case "team_id":
				a.TeamID, err = str(dec)
			case "round_number":
				a.Round, err = integer(dec)
			case "token_estimate":
				a.Tokens, err = integer(dec)
			case "code":
				a.Code, err = str(dec)
			case "truncated":
				a.Cuts, err = count(dec)
			default:
				err = dec.SkipValue()
			}
			return err
		})
	}); err != nil {
		return answer{}, err
	}
	return a, nil
}

// object reads an object, handing each member's name to member, which reads its value.
func object(dec *jsontext.Decoder, member func(name string) error) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	if tok.Kind() != '{' {
		return errNotAnAnswer
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return err
		}
		if err := member(name.String()); err != nil {
			return err
		}
	}
	_, err = dec.ReadToken()
	return err
}

// str reads a string, or skips anything else as "".
func str(dec *jsontext.Decoder) (string, error) {
	if dec.PeekKind() != '"' {
		return "", dec.SkipValue()
	}
	tok, err := dec.ReadToken()
	return tok.String(), err
}

// integer reads a whole number that fits an int, or skips anything else as 0.
func integer(dec *jsontext.Decoder) (int, error) {
	if dec.PeekKind() != '0' {
		return 0, dec.SkipValue()
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return 0, err
	}
	f := tok.Float()
	if f != math.Trunc(f) || f < math.MinInt32 || f > math.MaxInt32 {
		return 0, nil
	}
	return int(f), nil
}

// count reads an array and says how many elements it has.
func count(dec *jsontext.Decoder) (int, error) {
	if dec.PeekKind() != '[' {
		return 0, dec.SkipValue()
	}
	if _, err := dec.ReadToken(); err != nil {
		return 0, err
	}
	n := 0
	for dec.PeekKind() != ']' {
		if err := dec.SkipValue(); err != nil {
			return 0, err
		}
		n++
	}
	_, err := dec.ReadToken()
	return n, err
}
