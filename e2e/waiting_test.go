package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// TestNoOtherRoleTouchesAnOrchestratorsDurable, on the shipped nats.conf: an orchestrator waits
// for its answers on a durable consumer of its own on PROMPTS. Every other role but the operator
// (the services, every reader) finds it, and tries to pull from it, acknowledge on it, make it
// again with another filter, and delete it, before and while answers arrive: each is refused, the
// durable stays as the orchestrator made it, and the orchestrator gets every answer of its team,
// once each and in order. Readers read PROMPTS without consumers (internal/streamscan): the
// auditor's scan of the stream still reads every answer.
func TestNoOtherRoleTouchesAnOrchestratorsDurable(t *testing.T) {
	t.Parallel()
	ns := shippedNATS(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	jsAs := func(role string) jetstream.JetStream {
		nc, _ := connectAs(t, ns, role)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	operator, orchestrator := jsAs("operator"), jsAs("orchestrator")
	if _, err := events.MakeStreams(ctx, operator, events.StreamOptions{}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	const durable = "orchestrator-waits"
	filter := events.PromptComposedSubject("waits", "t1")
	cons, err := orchestrator.CreateOrUpdateConsumer(ctx, events.StreamPrompts, jetstream.ConsumerConfig{
		Durable: durable, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	others := []string{"ranker", "ranker-api", "composer", "composer-api", "archiver", "console", "auditor", "author", "release"}
	intruders := map[string]jetstream.JetStream{}
	for _, role := range others {
		intruders[role] = jsAs(role)
	}
	const answers = 12
	publish := func(i int) {
		if _, err := operator.Publish(ctx, filter, []byte("{}"), jetstream.WithMsgID(fmt.Sprintf("answer-%02d", i))); err != nil {
			t.Fatal(err)
		}
		// Another team's answer, which the orchestrator's filter leaves out.
		if _, err := operator.Publish(ctx, events.PromptComposedSubject("waits", "t2"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	// Each other role tries everything it might do to the durable; each must fail.
	intrude := func(when string) {
		for _, role := range others {
			js := intruders[role]
			try, stop := context.WithTimeout(ctx, time.Second)
			if c, err := js.Consumer(try, events.StreamPrompts, durable); err == nil {
				if batch, err := c.Fetch(5, jetstream.FetchMaxWait(500*time.Millisecond)); err == nil {
					for m := range batch.Messages() {
						t.Errorf("%s (%s): pulled %s from the orchestrator's durable", role, when, m.Headers().Get("Nats-Msg-Id"))
						if err := m.Ack(); err == nil {
							t.Errorf("%s (%s): acknowledged on the orchestrator's durable", role, when)
						}
					}
				}
			}
			if _, err := js.CreateOrUpdateConsumer(try, events.StreamPrompts, jetstream.ConsumerConfig{
				Durable: durable, FilterSubject: events.PromptComposedSubject("waits", "t2"), AckPolicy: jetstream.AckExplicitPolicy}); err == nil {
				t.Errorf("%s (%s): made the orchestrator's durable again with another filter", role, when)
			}
			if err := js.DeleteConsumer(try, events.StreamPrompts, durable); err == nil {
				t.Errorf("%s (%s): deleted the orchestrator's durable", role, when)
			}
			stop()
		}
	}
	intrude("before any answer")
	for i := range answers {
		publish(i)
		if i == answers/2 {
			intrude("while answers arrive")
		}
	}
	intrude("after every answer")

	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatalf("the orchestrator's durable: %v", err)
	}
	if info.Config.FilterSubject != filter || info.NumPending+uint64(info.NumAckPending) != answers || info.Delivered.Consumer != 0 {
		t.Fatalf("the orchestrator's durable changed: filter %s, %d pending, %d delivered", info.Config.FilterSubject, info.NumPending, info.Delivered.Consumer)
	}
	batch, err := cons.Fetch(answers, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for m := range batch.Messages() {
		if id, want := m.Headers().Get("Nats-Msg-Id"), fmt.Sprintf("answer-%02d", i); id != want {
			t.Fatalf("answer %d is %s, want %s", i, id, want)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		i++
	}
	if i != answers {
		t.Fatalf("the orchestrator got %d of %d answers", i, answers)
	}

	// What a reader reads instead: the stream itself, by direct gets. An auditor's `podium prompts
	// tail --all` prints every answer of the team, in order, and makes no consumer.
	cmd := exec.CommandContext(ctx, filepath.Join(bins.dir, "podium"), "prompts", "tail", "--all", "--count", fmt.Sprint(answers),
		"--execution", "waits", "--team", "t1")
	cmd.Env = append(os.Environ(), append(roleEnv("auditor"), "NATS_URL="+ns.ClientURL())...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("an auditor's prompts tail: %v\n%s", err, out)
	}
	if lines := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; lines != answers {
		t.Fatalf("an auditor's prompts tail printed %d lines, want %d:\n%s", lines, answers, out)
	}
	st, err := operator.Stream(ctx, events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Consumers; n != 1 {
		t.Fatalf("PROMPTS has %d consumers after the auditor's tail, want the orchestrator's alone", n)
	}
	t.Logf("%d roles tried the orchestrator's durable three times each: every pull, acknowledgement, change and delete refused; every answer arrived once, in order", len(others))
}
