package registry

import (
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/compose"
)

// written is a bucket's content where every key was written once, but those in again, written
// twice (the value given is the second).
func written(values map[string][]byte, again ...string) Content {
	c := NewContent()
	for k, v := range values {
		c.Values[k], c.Writes[k] = v, 1
	}
	for _, k := range again {
		c.Writes[k]++
	}
	return c
}

func doc(t *testing.T, name string, version int, text string) []byte {
	t.Helper()
	b, err := Encode(compose.Version{Name: name, Version: version, Files: map[string][]byte{"prompt.mustache": []byte(text)}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestParse reads the key layout back: versions by their key, labels naming a version with its
// digest, and every entry that does not fit the layout reported and left out.
func TestParse(t *testing.T) {
	v2 := doc(t, "greet", 2, "hi {{team.name}}")
	wrongNumber := doc(t, "greet", 5, "x")
	s, errs := Parse(written(map[string][]byte{
		VersionKey("greet", 2):          v2,
		LabelKey("greet", "production"): []byte("2@" + Digest(v2)),
		LabelKey("greet", "staging"):    []byte("two"),
		LabelKey("greet", "old"):        []byte("2"), // from before labels named a digest
		VersionKey("greet", 3):          wrongNumber, // a document of version 5 under the key of 3
		"greet.something":               []byte("x"),
		VersionKey("other", 1):          []byte("not json"),
	}))
	if len(s.Versions) != 1 || s.Versions[0].Name != "greet" || s.Versions[0].Version != 2 || string(s.Versions[0].Files["prompt.mustache"]) != "hi {{team.name}}" {
		t.Errorf("versions %+v", s.Versions)
	}
	if len(s.Labels) != 1 || s.Labels["greet"]["production"] != 2 || len(s.Labels["greet"]) != 1 || s.Digests["greet"][2] != Digest(v2) {
		t.Errorf("labels %v digests %v", s.Labels, s.Digests)
	}
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{`label greet.label.staging holds "two"`, "label old of greet names version 2 without its digest", "greet.v3 is not a version of greet", "unknown key greet.something", "other.v1 is not a version of other"} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors do not say %q:\n%s", want, joined)
		}
	}
}

// TestRewritten: a version key written again is never served from its key; a label whose copy
// holds the version's first document still serves that document, and only it.
func TestRewritten(t *testing.T) {
	first, second := doc(t, "greet", 1, "first"), doc(t, "greet", 1, "second")
	v2 := doc(t, "greet", 2, "two")
	tests := []struct {
		name     string
		content  Content
		served   string // greet@1's text, "" when not served
		labelled bool   // production names greet@1
		problem  string
	}{
		{"written once", written(map[string][]byte{VersionKey("greet", 1): first, LabelKey("greet", "production"): []byte("1@" + Digest(first))}), "first", true, ""},
		{"written again, no copy", written(map[string][]byte{VersionKey("greet", 1): second, LabelKey("greet", "production"): []byte("1@" + Digest(first))}, VersionKey("greet", 1)), "", false, "which the registry does not hold"},
		{"written again, a copy", written(map[string][]byte{VersionKey("greet", 1): second, LabelKey("greet", "production"): []byte("1@" + Digest(first)),
			PinKey("greet", "production", Digest(first)): first}, VersionKey("greet", 1)), "first", true, ""},
		{"written again with the same bytes", written(map[string][]byte{VersionKey("greet", 1): first}, VersionKey("greet", 1)), "", false, ""},
		{"deleted after a second write", written(map[string][]byte{VersionKey("greet", 2): v2}, VersionKey("greet", 1)), "", false, ""},
		{"a forged copy", written(map[string][]byte{VersionKey("greet", 1): second, LabelKey("greet", "production"): []byte("1@" + Digest(first)),
			PinKey("greet", "production", Digest(first)): second}, VersionKey("greet", 1)), "", false, "not the one its key names"},
		{"another label's copy does not serve", written(map[string][]byte{VersionKey("greet", 1): second, LabelKey("greet", "production"): []byte("1@" + Digest(first)),
			PinKey("greet", "staging", Digest(first)): first}, VersionKey("greet", 1)), "first", false, "which the registry does not hold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "deleted after a second write" {
				tt.content.Writes[VersionKey("greet", 1)] = 2 // no current value: written, then deleted
			}
			s, errs := Parse(tt.content)
			got := ""
			for _, v := range s.Versions {
				if v.Version == 1 {
					got = string(v.Files["prompt.mustache"])
				}
			}
			if tt.name == "another label's copy does not serve" {
				tt.served = "" // staging's copy serves staging, which names nothing here
			}
			if got != tt.served {
				t.Errorf("greet@1 serves %q, want %q", got, tt.served)
			}
			if _, ok := s.Labels["greet"]["production"]; ok != tt.labelled {
				t.Errorf("production labelled: %v, want %v (%v)", ok, tt.labelled, errs)
			}
			if tt.name != "written once" && (len(s.Rewritten["greet"]) != 1 || s.Rewritten["greet"][0] != 1) {
				t.Errorf("rewritten %v, want greet 1", s.Rewritten)
			}
			joined := ""
			for _, e := range errs {
				joined += e.Error() + "\n"
			}
			if (tt.problem == "") != (joined == "") || !strings.Contains(joined, tt.problem) {
				t.Errorf("problems %q, want %q", joined, tt.problem)
			}
		})
	}
}

func TestParseTarget(t *testing.T) {
	d5, d6 := strings.Repeat("a", 64), strings.Repeat("b", 64)
	tests := []struct {
		in, want string // want: the target as stored, "" for an error
	}{
		{"5", "5"},
		{"5@" + d5, "5@" + d5},
		{"5:" + d5, "5@" + d5}, // a builder label of before
		{"6@" + d6 + "=50,5@" + d5 + "=50", "5@" + d5 + "=50,6@" + d6 + "=50"},
		{"6=50,5=50", "5=50,6=50"},
		{"5=100", "5"},
		{"5@" + strings.Repeat("A", 64), ""},
		{"5@abc", ""},
		{"5=50,6", ""},
		{"5=0,6=10", ""},
		{"5=50,5=50", ""},
		{"x", ""},
		{"0", ""},
		{"5=-1", ""},
	}
	for _, tt := range tests {
		got, err := ParseTarget(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("ParseTarget(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("ParseTarget(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
	// A label naming several versions is a split of the state, one naming a version a plain label.
	a, b := doc(t, "greet", 1, "a"), doc(t, "greet", 2, "b")
	s, errs := Parse(written(map[string][]byte{VersionKey("greet", 1): a, VersionKey("greet", 2): b,
		"greet.label.production": []byte("1@" + Digest(a) + "=50,2@" + Digest(b) + "=50"), "greet.label.staging": []byte("2@" + Digest(b))}))
	if len(errs) != 0 || s.Splits["greet"]["production"].String() != "1=50,2=50" || s.Labels["greet"]["staging"] != 2 {
		t.Errorf("Parse: %+v %v", s, errs)
	}
}
