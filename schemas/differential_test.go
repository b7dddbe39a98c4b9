package schemas_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
)

// A differential test of the contract: every body of a generated corpus (valid examples with one
// field changed to a valid, edge or invalid value: nulls, times, media types, identifiers, unicode,
// numbers, sizes) is validated by ajv, as a JavaScript client does (conformance/validate.mjs, ajv
// 2020 with ajv-formats), and by the services' Go validation. Any body one accepts and the other
// refuses fails the test. Node and the locked npm packages are installed by `make test`
// (conformance/package-lock.json); outside CI the test skips when they are missing.

// variant is one value to put at one place of a body.
type variant struct {
	path  []string // keys from the envelope down ("data", "round_number")
	value any      // absent: delete the key
	del   bool
}

var (
	times = []string{
		"2026-11-24T10:00:00Z", "2026-11-24T10:00:00.123456Z", "2026-11-24T10:00:00.1234567891Z", "2026-11-24T10:00:00+09:00",
		"2026-11-24T10:00:00-00:00", "2026-11-24t10:00:00z", "2026-11-24T10:00:00z", "2026-11-24t10:00:00Z", "2026-11-24 10:00:00Z",
		"2026-11-24T23:59:60Z", "2026-11-24T10:00:00+0900", "2026-11-24T10:00:00+09", "2026-11-24T10:00:00,5Z",
		"2026-11-24T10:00Z", "2026-02-30T10:00:00Z", "2026-11-24T24:00:00Z", "2026-11-24T10:00:00", "2026-11-24T10:00:00.Z",
		"0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-11-24T10:00:00+24:00", "10:00", "", " 2026-11-24T10:00:00Z",
		"２０２６-11-24T10:00:00Z",
	}
	mediaTypes = []any{"application/json", "Application/JSON", "APPLICATION/JSON", "application/json; charset=utf-8",
		"application/json;charset=UTF-8", "application/json ", " application/json", "text/plain", "application/jsonx", "", nil, 1}
	identifiers = []any{"a", "team-alpha_2", strings.Repeat("x", 128), strings.Repeat("x", 129), "", "team alpha", "équipe",
		"team.alpha", "team*", "team>", nil, 7}
	texts   = []any{"x", "", "日本語のテキスト", "<script>alert(1)</script>", strings.Repeat("é", 3000), nil, 5, true}
	numbers = []any{json.Number("1"), json.Number("2.0"), json.Number("0"), json.Number("-1"), json.Number("1e3"), json.Number("1.5"),
		json.Number("4294967295"), json.Number("4294967296"), json.Number("1e999"), "2", nil}
	scores = []any{json.Number("82.5"), json.Number("-0"), json.Number("1e308"), json.Number("-1.7976931348623157e308"), json.Number("1e999"),
		"82.5", nil, json.Number("0")}
)

// corpus is every variant of every valid example.
func corpus(t *testing.T) []struct {
	typ, name string
	body      []byte
} {
	t.Helper()
	var out []struct {
		typ, name string
		body      []byte
	}
	add := func(typ, name string, body []byte) {
		out = append(out, struct {
			typ, name string
			body      []byte
		}{typ, name, body})
	}
	for _, typ := range eventTypes {
		files, _ := filepath.Glob(filepath.Join("testdata", typ, "valid", "*.json"))
		for _, file := range files {
			seed, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			base := typ + "/" + filepath.Base(file)
			add(typ, base, seed)
			for i, v := range variants(typ) {
				if b, ok := mutate(seed, v); ok {
					add(typ, fmt.Sprintf("%s#%d %s=%v", base, i, strings.Join(v.path, "."), v.value), b)
				}
			}
		}
	}
	return out
}

func variants(typ string) []variant {
	var vs []variant
	for _, s := range times {
		vs = append(vs, variant{path: []string{"time"}, value: s})
	}
	for _, m := range mediaTypes {
		vs = append(vs, variant{path: []string{"datacontenttype"}, value: m})
	}
	vs = append(vs, variant{path: []string{"datacontenttype"}, del: true}, variant{path: []string{"specversion"}, value: "1"},
		variant{path: []string{"specversion"}, value: json.Number("1.0")}, variant{path: []string{"id"}, value: strings.Repeat("i", 129)},
		variant{path: []string{"id"}, value: "id with ünïcode"}, variant{path: []string{"source"}, value: ""},
		variant{path: []string{"source"}, value: "orchestrator/a b"}, variant{path: []string{"traceparent"}, value: json.Number("5")})
	for _, id := range identifiers {
		vs = append(vs, variant{path: []string{"data", "execution_id"}, value: id}, variant{path: []string{"data", "team_id"}, value: id})
	}
	switch typ {
	case events.TypeEvaluationCompleted:
		for _, n := range numbers {
			vs = append(vs, variant{path: []string{"data", "round_number"}, value: n})
		}
		for _, s := range scores {
			vs = append(vs, variant{path: []string{"data", "evaluation", "overall_score"}, value: s})
		}
		for _, s := range times {
			vs = append(vs, variant{path: []string{"data", "evaluated_at"}, value: s})
		}
		for _, x := range texts {
			vs = append(vs, variant{path: []string{"data", "team_name"}, value: x}, variant{path: []string{"data", "evaluation", "feedback"}, value: x},
				variant{path: []string{"data", "submission", "content"}, value: x}, variant{path: []string{"data", "submission", "format"}, value: x})
		}
		vs = append(vs, variant{path: []string{"data", "evaluation", "metrics"}, value: nil}, variant{path: []string{"data", "evaluation", "metrics"}, value: []any{}})
	case events.TypeRoundRequested:
		for _, n := range numbers {
			vs = append(vs, variant{path: []string{"data", "round_number"}, value: n}, variant{path: []string{"data", "max_rounds"}, value: n})
		}
		for _, x := range []any{"asc", "desc", "ASC", "", nil, 1} {
			vs = append(vs, variant{path: []string{"data", "score_order"}, value: x})
		}
		for _, x := range []any{"live", "before_round", "Live", "", nil} {
			vs = append(vs, variant{path: []string{"data", "standings"}, value: x})
		}
		for _, x := range texts {
			vs = append(vs, variant{path: []string{"data", "user_prompt"}, value: x}, variant{path: []string{"data", "team_name"}, value: x},
				variant{path: []string{"data", "template"}, value: x}, variant{path: []string{"data", "model"}, value: x},
				variant{path: []string{"data", "timezone"}, value: x})
		}
		for _, x := range []any{"team-round", "team-round@2", "team-round:production", "team round", "@2", "team-round@", "team-round@x"} {
			vs = append(vs, variant{path: []string{"data", "template"}, value: x})
		}
		for _, x := range []any{"Asia/Tokyo", "UTC", "Not/AZone", "asia/tokyo"} {
			vs = append(vs, variant{path: []string{"data", "timezone"}, value: x})
		}
		vs = append(vs, variant{path: []string{"data", "vars"}, value: nil}, variant{path: []string{"data", "limits"}, value: nil},
			variant{path: []string{"data", "vars"}, value: []any{}})
	}
	return vs
}

// mutate sets v in body; false when the path does not exist in this example.
func mutate(body []byte, v variant) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, false
	}
	m := doc
	for _, k := range v.path[:len(v.path)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil, false
		}
		m = next
	}
	last := v.path[len(v.path)-1]
	if v.del {
		delete(m, last)
	} else {
		m[last] = v.value
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, false
	}
	return bytes.TrimSpace(buf.Bytes()), true
}

// ajvVerdicts runs the corpus through conformance/validate.mjs.
func ajvVerdicts(t *testing.T, cases []struct {
	typ, name string
	body      []byte
}) []struct {
	Valid bool   `json:"valid"`
	Error string `json:"error"`
} {
	t.Helper()
	node, err := exec.LookPath("node")
	_, modErr := os.Stat(filepath.Join("conformance", "node_modules", "ajv"))
	if err != nil || modErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node or the conformance packages are missing (make test installs them: npm ci --prefix schemas/conformance): %v %v", err, modErr)
		}
		t.Skip("node or schemas/conformance/node_modules missing: run `npm ci --prefix schemas/conformance`")
	}
	var in bytes.Buffer
	for _, c := range cases {
		line, _ := json.Marshal(map[string]string{"type": c.typ, "body": string(c.body)})
		in.Write(line)
		in.WriteByte('\n')
	}
	cmd := exec.Command(node, filepath.Join("conformance", "validate.mjs"))
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("validate.mjs: %v\n%s", err, stderr.String())
	}
	var verdicts []struct {
		Valid bool   `json:"valid"`
		Error string `json:"error"`
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v struct {
			Valid bool   `json:"valid"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("validate.mjs wrote %q: %v", sc.Text(), err)
		}
		verdicts = append(verdicts, v)
	}
	if len(verdicts) != len(cases) {
		t.Fatalf("validate.mjs answered %d of %d cases", len(verdicts), len(cases))
	}
	return verdicts
}

// TestAjvAndGoAgree is the differential test.
func TestAjvAndGoAgree(t *testing.T) {
	cases := corpus(t)
	verdicts := ajvVerdicts(t, cases)
	accepted, disagree := 0, 0
	for i, c := range cases {
		goErr := events.Validate(subjectFor(c.typ, c.body), c.body, events.DefaultMaxEventBytes)
		if verdicts[i].Valid {
			accepted++
		}
		if (goErr == nil) != verdicts[i].Valid {
			disagree++
			t.Errorf("%s: ajv valid=%v (%s), Go valid=%v (%v)", c.name, verdicts[i].Valid, verdicts[i].Error, goErr == nil, goErr)
		}
	}
	t.Logf("%d bodies, %d valid for both, %d disagreements", len(cases), accepted, disagree)
}

// TestSchemaPatternsAreGos: the patterns of times and of datacontenttype in every schema are the
// ones the Go validation matches, so the rule has one text.
func TestSchemaPatternsAreGos(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("events", "*.schema.json"))
	found := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch o := v.(type) {
			case map[string]any:
				if o["format"] == "date-time" {
					found++
					if o["pattern"] != events.TimePattern {
						t.Errorf("%s %s: pattern %v, want events.TimePattern", f, path, o["pattern"])
					}
				}
				for k, c := range o {
					if k == "datacontenttype" {
						if p := c.(map[string]any)["pattern"]; p != events.MediaTypePattern {
							t.Errorf("%s: datacontenttype pattern %v, want events.MediaTypePattern", f, p)
						}
					}
					walk(path+"/"+k, c)
				}
			case []any:
				for i, c := range o {
					walk(fmt.Sprintf("%s/%d", path, i), c)
				}
			}
		}
		walk("", doc)
	}
	if found < 6 {
		t.Errorf("only %d date-time fields found", found)
	}
}
