package schemas_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/schemas"
)

var eventTypes = []string{
	events.TypeEvaluationCompleted, events.TypeRoundRequested, events.TypePromptComposed,
	events.TypePromptFailed, events.TypeLeaderboardUpdated,
}

// compile loads every embedded schema with format assertions on (date-time, uri-reference).
func compile(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	out := map[string]*jsonschema.Schema{}
	for _, typ := range eventTypes {
		name := typ + ".schema.json"
		b, err := fs.ReadFile(schemas.Events(), name)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		id := "https://podium-llm.github.io/schemas/" + name
		if got := doc.(map[string]any)["$id"]; got != id {
			t.Errorf("%s: $id is %v, want %s", name, got, id)
		}
		if got := doc.(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["const"]; got != typ {
			t.Errorf("%s: type const is %v, want %s", name, got, typ)
		}
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
		s, err := c.Compile(id)
		if err != nil {
			t.Fatalf("compile %s: %v", name, err)
		}
		out[typ] = s
	}
	return out
}

// subjectFor derives the subject an example would arrive on from its body.
func subjectFor(typ string, body []byte) string {
	var env struct {
		Data struct {
			ExecutionID any `json:"execution_id"`
			TeamID      any `json:"team_id"`
		} `json:"data"`
	}
	_ = json.Unmarshal(body, &env)
	exec, _ := env.Data.ExecutionID.(string)
	team, _ := env.Data.TeamID.(string)
	if exec == "" {
		exec = "x"
	}
	if team == "" {
		team = "y"
	}
	if typ == events.TypeLeaderboardUpdated {
		return events.LeaderboardSubject(exec)
	}
	return typ + "." + exec + "." + team
}

// TestSchemasAndGoValidationAgree checks every example against its JSON Schema and against
// events.Validate: valid examples pass both, invalid ones fail both, so the two cannot drift.
// Examples in invalid-go-only/ break rules JSON Schema cannot express (a metric_name repeated in a
// list, the subject/body agreement, the byte limit, UTF-8 validity): the schema accepts them and
// Go must reject them.
func TestSchemasAndGoValidationAgree(t *testing.T) {
	compiled := compile(t)
	total := 0
	for _, typ := range eventTypes {
		for _, kind := range []string{"valid", "invalid", "invalid-go-only"} {
			files, _ := filepath.Glob(filepath.Join("testdata", typ, kind, "*.json"))
			if len(files) == 0 && kind != "invalid-go-only" {
				t.Errorf("no %s examples for %s", kind, typ)
			}
			for _, file := range files {
				total++
				t.Run(typ+"/"+kind+"/"+filepath.Base(file), func(t *testing.T) {
					body, err := os.ReadFile(file)
					if err != nil {
						t.Fatal(err)
					}
					subject := subjectFor(typ, body)
					limit := events.DefaultMaxEventBytes
					switch base := filepath.Base(file); {
					case strings.HasPrefix(base, "subject-body-mismatch"):
						subject = typ + ".exec-7f3a.team-alpha" // the body names team-other
					case strings.HasPrefix(base, "over-max-event-bytes"):
						limit = 4096
					}
					var schemaErr error
					doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
					if err != nil {
						schemaErr = fmt.Errorf("not JSON: %w", err)
					} else {
						schemaErr = compiled[typ].Validate(doc)
					}
					goErr := events.Validate(subject, body, limit)
					wantSchemaValid := kind != "invalid"
					wantGoValid := kind == "valid"
					if (schemaErr == nil) != wantSchemaValid {
						t.Errorf("schema: valid=%v, want %v (%v)", schemaErr == nil, wantSchemaValid, schemaErr)
					}
					if (goErr == nil) != wantGoValid {
						t.Errorf("Go: valid=%v, want %v (%v)", goErr == nil, wantGoValid, goErr)
					}
				})
			}
		}
	}
	if total < 100 {
		t.Errorf("only %d examples; the corpus shrank", total)
	}
}

// TestCommittedNoticeMatchesItsSchema: what the ranker publishes on ranker.committed is what its
// schema says.
func TestCommittedNoticeMatchesItsSchema(t *testing.T) {
	c := jsonschema.NewCompiler()
	b, err := fs.ReadFile(schemas.Events(), "ranker.committed.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("ranker.committed.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("ranker.committed.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(events.Committed{EvaluationsSeq: 42})
	notice, _ := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err := sch.Validate(notice); err != nil {
		t.Errorf("%s: %v", body, err)
	}
	bad, _ := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(`{"evaluations_seq": -1}`)))
	if sch.Validate(bad) == nil {
		t.Error("a negative sequence passed")
	}
}
