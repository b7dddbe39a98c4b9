package registry

import (
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/compose"
)

// TestParse reads the key layout back: versions by their key, labels as decimal versions, and
// every entry that does not fit the layout reported and left out.
func TestParse(t *testing.T) {
	v2, err := Encode(compose.Version{Name: "greet", Version: 2, Files: map[string][]byte{"prompt.mustache": []byte("hi {{team.name}}")}})
	if err != nil {
		t.Fatal(err)
	}
	wrongNumber, _ := Encode(compose.Version{Name: "greet", Version: 5})
	s, errs := Parse(map[string][]byte{
		VersionKey("greet", 2):          v2,
		LabelKey("greet", "production"): []byte("2"),
		LabelKey("greet", "staging"):    []byte("two"),
		VersionKey("greet", 3):          wrongNumber, // a document of version 5 under the key of 3
		"greet.something":               []byte("x"),
		VersionKey("other", 1):          []byte("not json"),
	})
	if len(s.Versions) != 1 || s.Versions[0].Name != "greet" || s.Versions[0].Version != 2 || string(s.Versions[0].Files["prompt.mustache"]) != "hi {{team.name}}" {
		t.Errorf("versions %+v", s.Versions)
	}
	if len(s.Labels) != 1 || s.Labels["greet"]["production"] != 2 || len(s.Labels["greet"]) != 1 {
		t.Errorf("labels %v", s.Labels)
	}
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{`label greet.label.staging holds "two"`, "greet.v3 is not a version of greet", "unknown key greet.something", "other.v1 is not a version of other"} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors do not say %q:\n%s", want, joined)
		}
	}
}

func TestParseSplit(t *testing.T) {
	tests := []struct {
		in, want string // want: the split as stored, "" for an error
	}{
		{"5", "5=1"},
		{"6=50,5=50", "5=50,6=50"},
		{"5=100", "5=100"},
		{"5=50,6", ""},
		{"5=0,6=10", ""},
		{"5=50,5=50", ""},
		{"x", ""},
		{"0", ""},
		{"5=-1", ""},
	}
	for _, tt := range tests {
		got, err := ParseSplit(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("ParseSplit(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("ParseSplit(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
	// A label holding a split is a split of the state, one holding a version a plain label.
	s, errs := Parse(map[string][]byte{"greet.label.production": []byte("1=50,2=50"), "greet.label.staging": []byte("2")})
	if len(errs) != 0 || s.Splits["greet"]["production"].String() != "1=50,2=50" || s.Labels["greet"]["staging"] != 2 {
		t.Errorf("Parse: %+v %v", s, errs)
	}
}
