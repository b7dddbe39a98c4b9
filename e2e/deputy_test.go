package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// The composer as a confused deputy (docs/security.md): a request whose reply subject is a stream's
// subject would have the composer publish there with its own permissions. Every endpoint that
// answers requests is tried, as every shipped role, with a reply subject on every stream's
// subjects: nothing lands, and requests with an inbox reply are still answered.

// requestEndpoints are the subjects the composer answers requests on: its micro service's two
// endpoints and the service's discovery subjects.
var requestEndpoints = []string{"podium.render", "podium.parse",
	"$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.PING.podium", "$SRV.INFO.podium", "$SRV.STATS.podium"}

// streamReplies are reply subjects on each stream's (and each bucket's) subjects.
var streamReplies = []string{
	events.PromptComposedSubject("deputy", "t1"), events.PromptFailedSubject("deputy", "t1"),
	events.EvaluationSubject("deputy", "t1"), events.RoundSubject("deputy", "t1"),
	"leaderboard.updated.deputy", "deadletter.round.requested.deputy.t1",
	"$KV.TEMPLATES.greet.label.production", "$KV.BUILDERS.phi4mini.label.production",
	"$KV." + events.BucketAnswered + ".deputy", "$KV." + events.BucketScores + ".deputy",
	"builders.modules.deputy", "builders.releases.deputy",
}

// deputyBody is a valid request of an endpoint (an invalid one is answered too, with an error).
func deputyBody(endpoint string) []byte {
	switch endpoint {
	case "podium.render":
		b, _ := json.Marshal(map[string]any{"execution_id": "deputy", "team_id": "t1", "team_name": "One", "round_number": 1,
			"user_prompt": "Go.", "time": t0.Format(time.RFC3339)})
		return b
	case "podium.parse":
		return []byte(`{"model": "phi-4-mini", "output": "hello"}`)
	}
	return nil
}

// TestComposerAnswersOnlyInboxes runs the composer under the shipped users: every role sends every
// endpoint a request with every stream reply subject (the server refuses some of those publishes,
// the composer's code refuses the renders and parses, the server refuses the answers of $SRV), and
// no stream or bucket holds anything under those subjects afterwards; normal requests are answered.
func TestComposerAnswersOnlyInboxes(t *testing.T) {
	t.Parallel()
	ns := shippedNATS(t)
	orch, _ := connectAs(t, ns, "orchestrator")
	ojs, err := jetstream.New(orch)
	if err != nil {
		t.Fatal(err)
	}
	addr, db := testenv.Database(t)
	e := &env{t: t, ns: ns, nc: orch, js: ojs, chAddr: addr, database: db}
	e.start("ranker", "NATS_USER=ranker", "NATS_PASSWORD=ranker-pw", "RANKER_API_NATS_USER=ranker-api", "RANKER_API_NATS_PASSWORD=ranker-api-pw")
	composer := e.start("composer", "NATS_USER=composer", "NATS_PASSWORD=composer-pw",
		"COMPOSER_API_NATS_USER=composer-api", "COMPOSER_API_NATS_PASSWORD=composer-api-pw")

	sent := 0 // renders and parses whose publish the server took: each is refused by the composer
	for _, role := range natsRoles {
		nc, _ := connectAs(t, ns, role)
		for _, ep := range requestEndpoints {
			for _, reply := range streamReplies {
				if err := nc.PublishMsg(&nats.Msg{Subject: ep, Reply: reply, Data: deputyBody(ep)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		// The shipped users that may send podium.render and podium.parse; the server refuses the
		// others' publishes.
		if role == "orchestrator" || role == "operator" {
			sent += 2 * len(streamReplies)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the composer to refuse every render and parse with a stream reply", func() (bool, string) {
		n := composer.metric(t, `composer_replies_refused_total{endpoint="render"}`) + composer.metric(t, `composer_replies_refused_total{endpoint="parse"}`)
		return int(n) == sent, fmt.Sprintf("%v of %d refused", n, sent)
	})
	// The $SRV answers the server refused (only the operator may ask them): the composer's API
	// connection hears each refusal, so they were tried and stopped.
	srv := 6 * len(streamReplies)
	testenv.WaitFor(t, 30*time.Second, "the server to refuse every $SRV answer to a stream subject", func() (bool, string) {
		n := strings.Count(composer.logs.String(), "Permissions Violation for Publish to")
		return n >= srv, fmt.Sprintf("%d of %d refusals in the composer's log", n, srv)
	})

	// Requests with an inbox reply are answered, by every endpoint.
	render, err := orch.Request("podium.render", deputyBody("podium.render"), 20*time.Second)
	if err != nil || !strings.Contains(string(render.Data), `"prompt"`) {
		t.Errorf("podium.render with an inbox reply: %v %s", err, msgData(render))
	}
	if parse, err := orch.Request("podium.parse", deputyBody("podium.parse"), 20*time.Second); err != nil || len(parse.Data) == 0 {
		t.Errorf("podium.parse with an inbox reply: %v %s", err, msgData(parse))
	}
	op, _ := connectAs(t, ns, "operator")
	if info, err := op.Request("$SRV.INFO.podium", nil, 10*time.Second); err != nil || !strings.Contains(string(info.Data), `"render"`) {
		t.Errorf("$SRV.INFO.podium with an inbox reply: %v %s", err, msgData(info))
	}

	// A composer given no user of its own for answering (the composer's may not subscribe to the
	// endpoints) stops at start saying so, instead of running deaf to every request.
	deaf := e.spawn("composer", "NATS_USER=composer", "NATS_PASSWORD=composer-pw")
	select {
	case err := <-deaf.done:
		deaf.done <- err
		if err == nil || !strings.Contains(deaf.logs.String(), "give it a NATS user that may (COMPOSER_API_NATS_USER") {
			t.Errorf("a composer without an API user: %v\n%s", err, deaf.logs)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("a composer without an API user still runs after 30 s:\n%s", deaf.logs)
	}

	// Nothing landed under any of the subjects, in any stream that takes them.
	ajs, err := jetstream.New(op)
	if err != nil {
		t.Fatal(err)
	}
	for _, reply := range streamReplies {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		name, err := ajs.StreamNameBySubject(ctx, reply)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			cancel()
			continue // no stream takes it here: nothing can land
		}
		if err != nil {
			cancel()
			t.Fatalf("the stream of %s: %v", reply, err)
		}
		st, err := ajs.Stream(ctx, name)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		msg, err := st.GetLastMsgForSubject(ctx, reply)
		cancel()
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("%s holds a message on %s: %v %s", name, reply, err, func() string {
				if msg == nil {
					return ""
				}
				return string(msg.Data)
			}())
		}
	}
}

func msgData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return fmt.Sprintf("%.300s", m.Data)
}
