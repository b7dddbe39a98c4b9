// Command orchestrator-go plays a tournament against Podium with pkg/client, as an orchestrator
// written from docs/orchestrators.md would: every round, each team asks for its prompt, answers
// it, and its evaluation is published; at the end the leaderboard is read as of the last
// evaluation and printed, last as one JSON line. The team's "model" and the evaluator are stand-ins
// (a digest of the prompt, a score from it): the plumbing is what it shows.
//
//	NATS_URL=nats://127.0.0.1:4222 go run .
//
// The board is read over NATS (podium.leaderboard); RANKER_URL (and RANKER_API_TOKEN beyond
// loopback) reads it over HTTP instead.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/pkg/client"
	"github.com/podium-llm/podium/pkg/events"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orchestrator-go:", err)
		os.Exit(1)
	}
}

// settings are what the example reads from its environment.
type settings struct {
	natsURL, natsUser, natsPassword string
	rankerURL, rankerToken          string
	execution                       string
	teams, rounds                   int
}

func read(getenv func(string) string) (settings, error) {
	s := settings{natsURL: or(getenv("NATS_URL"), nats.DefaultURL), natsUser: getenv("NATS_USER"), natsPassword: getenv("NATS_PASSWORD"),
		rankerURL: getenv("RANKER_URL"), rankerToken: getenv("RANKER_API_TOKEN"),
		execution: or(getenv("EXECUTION"), "go-example")}
	var err error
	if s.teams, err = strconv.Atoi(or(getenv("TEAMS"), "3")); err != nil || s.teams < 1 {
		return s, fmt.Errorf("TEAMS must be a positive number, got %q", getenv("TEAMS"))
	}
	if s.rounds, err = strconv.Atoi(or(getenv("ROUNDS"), "3")); err != nil || s.rounds < 1 {
		return s, fmt.Errorf("ROUNDS must be a positive number, got %q", getenv("ROUNDS"))
	}
	return s, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func run(ctx context.Context, getenv func(string) string, out io.Writer) error {
	s, err := read(getenv)
	if err != nil {
		return err
	}
	opts := []nats.Option{nats.Name("orchestrator-go"), nats.MaxReconnects(-1)}
	if s.natsUser != "" {
		opts = append(opts, nats.UserInfo(s.natsUser, s.natsPassword))
	}
	nc, err := nats.Connect(s.natsURL, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := client.New(nc, client.Options{Source: "orchestrator/go-example", RankerURL: s.rankerURL, RankerToken: s.rankerToken})
	if err != nil {
		return err
	}
	start := time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC) // the tournament's clock: events carry it, never the wall clock
	var last uint64
	for round := 1; round <= s.rounds; round++ {
		seqs := make([]uint64, s.teams)
		errs := make([]error, s.teams)
		var wg sync.WaitGroup
		for i := range s.teams {
			wg.Go(func() {
				seqs[i], errs[i] = play(ctx, c, s.execution, fmt.Sprintf("team-%d", i+1), round, start.Add(time.Duration(round)*time.Hour))
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		for _, seq := range seqs {
			last = max(last, seq)
		}
		fmt.Fprintf(out, "round %d: %d teams prompted and evaluated\n", round, s.teams)
	}
	board, err := c.Board(ctx, s.execution, last)
	if err != nil {
		return err
	}
	for _, row := range board.Teams {
		fmt.Fprintf(out, "%d. %s: best %.2f in round %d (%d rounds)\n", row.Position, row.TeamName, row.BestScore, row.BestRound, row.Rounds)
	}
	line, err := json.Marshal(board)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", line)
	return err
}

// play is one team's round: its prompt, its answer, its evaluation; it returns the evaluation's
// sequence. A request is asked again under the same id while no answer comes; a failure is tried
// again under a new attempt's id when retryable, else returned.
func play(ctx context.Context, c *client.Client, exec, team string, round int, at time.Time) (uint64, error) {
	var prompt events.PromptComposed
	for attempt := 1; ; attempt++ {
		id := client.ID("req", exec, team, strconv.Itoa(round), strconv.Itoa(attempt))
		req := events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: team, RoundNumber: round, UserPrompt: "Write the shortest sort you can."}
		var err error
		for {
			wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
			prompt, err = c.RequestPrompt(wait, id, at, req)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
				break // answered, failed, or the example is stopping; silence: ask again, same id
			}
		}
		var failed *client.Failed
		if errors.As(err, &failed) && failed.Retryable && attempt < 3 {
			continue
		}
		if err != nil {
			return 0, err
		}
		break
	}
	// The team's answer and its score: stand-ins, made from the prompt alone.
	sum := sha256.Sum256([]byte(prompt.Prompt))
	answer := "answer " + hex.EncodeToString(sum[:8])
	score := float64(sum[0]) / 2.55
	ev := events.EvaluationCompleted{ExecutionID: exec, TeamID: team, TeamName: team, RoundNumber: round,
		Submission: events.Submission{Content: answer, Format: "text"},
		Evaluation: events.Scores{OverallScore: score, Feedback: "scored from the answer's digest"}, EvaluatedAt: at.Add(30 * time.Minute)}
	return c.PublishEvaluation(ctx, client.ID("eval", exec, team, strconv.Itoa(round)), at.Add(30*time.Minute), ev)
}
