package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestJetStreamAwayTurnsUnready: the NATS server stays up but JetStream goes away (disabled on
// the server: its API answers nothing, as with permissions revoked or a stream without a quorum).
// Nothing is consumed, though no consumer is lost: the ranker and the composer turn unready
// naming what fails ("consuming"), never ready while consuming nothing; with JetStream back they
// consume again, ready, and an evaluation and a request sent then are committed and answered.
func TestJetStreamAwayTurnsUnready(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	composer := e.start("composer")
	e.publishEvaluation("before", evaluation("away", "t1", "Team t1", 1, 60, "before the fault", t0))
	waitCommitted(t, e, 1)

	cfg := *e.ns.JetStreamConfig()
	cfg.StoreDir = filepath.Dir(cfg.StoreDir) // as configured: the server adds "jetstream" to it
	if err := e.ns.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proc{ranker, composer} {
		testenv.WaitFor(t, 30*time.Second, p.name+" unready naming consuming", func() (bool, string) {
			code, body := readiness(p)
			return code == http.StatusServiceUnavailable && strings.Contains(body, `"consuming"`), fmt.Sprintf("%d %s", code, body)
		})
		_, body := readiness(p)
		t.Logf("%s with JetStream away: %s", p.name, body)
	}
	if err := e.ns.EnableJetStream(&cfg); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitReadiness(t, ranker, http.StatusOK, 60*time.Second)
	waitReadiness(t, composer, http.StatusOK, 60*time.Second)
	t.Logf("JetStream back: both ready %s later", time.Since(back).Round(time.Millisecond))
	e.publishEvaluation("after", evaluation("away", "t2", "Team t2", 1, 80, "after the fault", t0))
	waitCommitted(t, e, 2)
	e.requestRound("away-req", events.RoundRequested{ExecutionID: "away", TeamID: "t1", TeamName: "Team t1", RoundNumber: 2, UserPrompt: "Again."}, t0.Add(time.Hour))
	a := e.answers("prompt.*.away.*", 1, 30*time.Second)["away-req"]
	if !a.ok() || !strings.Contains(a.composed.Prompt, "before the fault") {
		t.Errorf("the request after the fault: %s %+v\n%s", a.subject, a.failed, a.composed.Prompt)
	}
}
