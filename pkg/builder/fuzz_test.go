package builder

import (
	"testing"
	"unicode/utf8"
)

// FuzzDecodeBuilt: whatever a module prints, decoding it never panics, and what it accepts holds
// what the host relies on: a prompt or messages, every role named, every text UTF-8.
func FuzzDecodeBuilt(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"prompt":"p","params":{"temperature":0.2}}`,
		`{"prompt":""}`, `{"messages":[]}`, `{"messages":[{"role":"","content":"x"}]}`, `{"messages":null,"prompt":null}`,
		`{"messages":[{"role":"user","content":"\xff"}]}`, `{"prompt":"a"} {"prompt":"b"}`, `{"other":1}`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		b, err := DecodeBuilt(out)
		if err != nil {
			return
		}
		if b.Prompt == nil && len(b.Messages) == 0 {
			t.Fatalf("%q: accepted with neither messages nor a prompt", out)
		}
		for _, m := range b.Messages {
			if m.Role == "" || !utf8.ValidString(m.Role) || !utf8.ValidString(m.Content) {
				t.Fatalf("%q: accepted message %+v", out, m)
			}
		}
		if b.Prompt != nil && !utf8.ValidString(*b.Prompt) {
			t.Fatalf("%q: accepted a prompt that is not UTF-8", out)
		}
	})
}
