package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestAnAuthorCannotChangeProduction, on a server from deploy/nats/nats.conf as shipped: the
// author may push versions and write their keys, the release role moves production. An author
// who writes a labelled version's key again, or tries a rollup, a delete of production's label or
// a write of its copy, changes nothing that a composer serves, whether it ran before or started
// after; the rewrite is named by the CLI. A release by VERSION@DIGEST refuses a version that is
// no longer what was reviewed, and a version whose key was written again before any label named
// it is never served nor labelled.
func TestAnAuthorCannotChangeProduction(t *testing.T) {
	t.Parallel()
	ns := shippedNATS(t)
	addr, db := testenv.Database(t)
	e := &env{t: t, ns: ns, chAddr: addr, database: db}
	as := func(role string) []string { return []string{"NATS_USER=" + role, "NATS_PASSWORD=" + role + "-pw"} }
	e.start("ranker", append(as("ranker"), "RANKER_API_NATS_USER=ranker-api", "RANKER_API_NATS_PASSWORD=ranker-api-pw")...)
	composerEnv := append(as("composer"), "COMPOSER_API_NATS_USER=composer-api", "COMPOSER_API_NATS_PASSWORD=composer-api-pw")
	before := e.start("composer", composerEnv...)

	if out, code := e.podium(t, as("author"), "templates", "push", greetVersion(t, "REVIEWED")); code != 0 {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	// The digest is the test's own: the sha256 of the bytes the author's push stored.
	nc, _ := connectAs(t, ns, "author")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), "TEMPLATES")
	if err != nil {
		t.Fatal(err)
	}
	digestOf := func(key string) string {
		t.Helper()
		entry, err := kv.Get(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(entry.Value())
		return hex.EncodeToString(sum[:])
	}
	reviewed := digestOf("greet.v1")
	out, code := e.podium(t, as("release"), "templates", "label", "greet", "1@"+reviewed, "production")
	if code != 0 || !strings.Contains(out, "label production of greet -> 1@"+reviewed) {
		t.Fatalf("release of greet 1@%s: exit %d\n%s", reviewed, code, out)
	}
	// What a render served: its prompt and the template it names (a label's name aside).
	render := func(p *proc, template string) (int, string) {
		status, body := p.render(t, map[string]any{"execution_id": "immutable", "team_id": "t1", "team_name": "One", "round_number": 1, "user_prompt": "Go.", "template": template})
		var got events.PromptComposed
		if status != http.StatusOK || json.Unmarshal(body, &got) != nil {
			return status, string(body)
		}
		return status, fmt.Sprintf("%s@%d %s\n%s", got.Template.Name, got.Template.Version, got.Template.SHA256, got.Prompt)
	}
	var served string
	testenv.WaitFor(t, 10*time.Second, "production served", func() (bool, string) {
		status, body := render(before, "greet")
		served = body
		return status == http.StatusOK && strings.Contains(body, "REVIEWED system for One"), body
	})

	// The author's attempts. Writing the version's key again is allowed (its job is to write
	// versions); everything else is refused by the server.
	evil, err := kv.Get(t.Context(), "greet.v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "greet.v1", []byte(strings.ReplaceAll(string(evil.Value()), "REVIEWED", "EVIL"))); err != nil {
		t.Fatalf("the author's rewrite of its version: %v", err)
	}
	rollup := nats.NewMsg("$KV.TEMPLATES.greet.v1")
	rollup.Header.Set("Nats-Rollup", "all")
	rollup.Data = []byte("{}")
	if _, err := js.PublishMsg(t.Context(), rollup); err == nil {
		t.Error("the author's rollup of TEMPLATES was stored")
	}
	for _, subject := range []string{"$KV.TEMPLATES.greet.label.production", "$KV.TEMPLATES.greet.pin.production." + reviewed} {
		refused(t, ns, "author", subject)
	}
	testenv.WaitFor(t, 10*time.Second, "the rewrite named", func() (bool, string) {
		out, _ := e.podium(t, as("author"), "templates", "history", "greet")
		return strings.Contains(out, "version 1 written again (never served from its key)"), out
	})
	after := e.start("composer", composerEnv...)
	waitReadiness(t, after, http.StatusOK, 30*time.Second)
	for _, p := range []*proc{before, after} {
		for _, ref := range []string{"greet", "greet@1", "greet:production"} {
			if status, body := render(p, ref); status != http.StatusOK || body != served {
				t.Errorf("%s after the author's rewrite: %d\n%s\nwant, as before it:\n%s", ref, status, body, served)
			}
		}
	}
	if out, code := e.podium(t, as("author"), "templates", "list"); code != 0 || !regexp.MustCompile(`greet\s+1\s+latest=1 production=1\s+1\n`).MatchString(out) {
		t.Errorf("list after the rewrite: exit %d\n%s", code, out)
	}

	// A release names what was reviewed: a version changed since is refused.
	if out, code := e.podium(t, as("author"), "templates", "push", greetVersion(t, "SECOND")); code != 0 {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	second := digestOf("greet.v2")
	if _, err := kv.Put(t.Context(), "greet.v2", []byte(strings.ReplaceAll(string(evil.Value()), "REVIEWED", "CHANGED"))); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{"2@" + second, "2"} {
		out, code := e.podium(t, as("release"), "templates", "label", "greet", spec, "production")
		if code != 1 || !strings.Contains(out, "version 2 of greet was written again after it was pushed") {
			t.Errorf("release of %s after its key was written again: exit %d\n%s", spec, code, out)
		}
	}
	if out, code := e.podium(t, as("author"), "templates", "push", greetVersion(t, "THIRD")); code != 0 {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	out, code = e.podium(t, as("release"), "templates", "label", "greet", "3@"+second, "production")
	if code != 1 || !strings.Contains(out, "it is not what was reviewed") {
		t.Errorf("release of version 3 by another digest: exit %d\n%s", code, out)
	}
	for _, p := range []*proc{before, after} {
		if status, body := render(p, "greet@2"); status != http.StatusUnprocessableEntity || !strings.Contains(body, "unknown_template") {
			t.Errorf("greet@2, written again and never labelled: %d %s", status, body)
		}
		if status, body := render(p, "greet"); status != http.StatusOK || body != served {
			t.Errorf("production after the refused releases: %d %s", status, body)
		}
	}
}
