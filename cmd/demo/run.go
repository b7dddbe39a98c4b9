package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/pkg/events"
)

type team struct{ id, name string }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binDir := fs.String("bin", "bin", "directory holding the ranker and composer binaries")
	rounds := fs.Int("rounds", 3, "rounds to play")
	lines := fs.Int("lines", 12, "lines of each prompt to print; from round 2 on, the first team's prompt is printed whole")
	keep := fs.Bool("keep", false, "keep the temporary directory (ClickHouse data, service logs)")
	serve := fs.Bool("serve", false, "after the tournament, keep everything running with the web console until Ctrl-C")
	consoleAddr := fs.String("console-addr", "127.0.0.1:8090", "where the web console listens (another free loopback port when taken)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the usage is printed: asking for it is not an error
		}
		return err
	}
	teams := []team{{"team-alpha", "Alpha"}, {"team-beta", "Beta"}, {"team-gamma", "Gamma"}, {"team-delta", "Delta"}}

	dir, err := os.MkdirTemp("", "podium-demo-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(stdout, "working directory: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	step(stdout, "starting a private ClickHouse")
	ch, err := servers.StartClickHouse(ctx, filepath.Join(dir, "clickhouse"))
	if err != nil {
		return err
	}
	defer ch.Stop()
	fmt.Fprintf(stdout, "  clickhouse-server on %s\n", ch.Addr)

	step(stdout, "starting JetStream in-process")
	ns, err := servers.StartNATS(filepath.Join(dir, "jetstream"))
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	fmt.Fprintf(stdout, "  nats-server on %s\n", ns.ClientURL())

	env := []string{"PATH=" + os.Getenv("PATH"), "NATS_URL=" + ns.ClientURL(), "CLICKHOUSE_ADDR=" + ch.Addr,
		"CLICKHOUSE_DATABASE=demo", "LOG_LEVEL=info", "TZ=UTC"}
	step(stdout, "starting ranker, composer and archiver")
	ranker, err := startService(ctx, filepath.Join(*binDir, "ranker"), dir, env, "HTTP_ADDR", "")
	if err != nil {
		return err
	}
	defer ranker.stop(stdout)
	composer, err := startService(ctx, filepath.Join(*binDir, "composer"), dir, env, "HTTP_ADDR", "")
	if err != nil {
		return err
	}
	defer composer.stop(stdout)
	archiver, err := startService(ctx, filepath.Join(*binDir, "archiver"), dir, env, "HTTP_ADDR", "")
	if err != nil {
		return err
	}
	defer archiver.stop(stdout)
	fmt.Fprintf(stdout, "  ranker http://%s   composer http://%s   archiver http://%s   (logs in %s)\n", ranker.addr, composer.addr, archiver.addr, dir)
	step(stdout, "starting the web console")
	console, err := startService(ctx, filepath.Join(*binDir, "console"), dir, env, "CONSOLE_ADDR", *consoleAddr)
	if err != nil {
		return err
	}
	defer console.stop(stdout)
	fmt.Fprintf(stdout, "  console http://%s   (open it now: the pages follow the tournament live)\n", console.addr)

	nc, err := nats.Connect(ns.ClientURL(), nats.Name("demo-orchestrator"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	const exec = "demo-exec"
	answers, err := js.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"prompt.*." + exec + ".*"}})
	if err != nil {
		return fmt.Errorf("follow PROMPTS: %w", err)
	}
	clock := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
	start := time.Now()
	for round := 1; round <= *rounds; round++ {
		step(stdout, fmt.Sprintf("round %d: requesting a prompt for each team", round))
		for _, tm := range teams {
			rr := events.RoundRequested{ExecutionID: exec, TeamID: tm.id, TeamName: tm.name, RoundNumber: round,
				UserPrompt: "Propose a name and a one-paragraph pitch for a tool that makes distributed systems boring to operate.",
				MaxRounds:  *rounds}
			id := fmt.Sprintf("req-%s-%d", tm.id, round)
			if err := publish(ctx, js, events.RoundSubject(exec, tm.id), id, events.TypeRoundRequested, clock, rr); err != nil {
				return err
			}
		}
		for i := range teams {
			msg, err := next(ctx, answers)
			if err != nil {
				return err
			}
			// One prompt whole from round 2 on: its history, feedback and leaderboard are what the
			// pipeline exists to build.
			show := *lines
			if round > 1 && i == 0 {
				show = 0
			}
			if err := printAnswer(stdout, msg, show); err != nil {
				return err
			}
		}
		step(stdout, fmt.Sprintf("round %d: teams submit, the evaluator scores", round))
		for _, tm := range teams {
			clock = clock.Add(time.Minute)
			ev := synthetic(exec, tm, round, clock)
			id := fmt.Sprintf("eval-%s-%d", tm.id, round)
			if err := publish(ctx, js, events.EvaluationSubject(exec, tm.id), id, events.TypeEvaluationCompleted, clock, ev); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "  %-6s round %d scored %6.2f\n", tm.name, round, ev.Evaluation.OverallScore)
		}
		clock = clock.Add(time.Hour)
	}

	step(stdout, "final leaderboard (ranker API)")
	if err := waitForRounds(ctx, ranker.addr, exec, len(teams)**rounds); err != nil {
		return err
	}
	var lb struct {
		Teams          []events.LeaderboardRow `json:"teams"`
		EvaluationsSeq uint64                  `json:"evaluations_seq"`
	}
	if err := getJSON(ctx, "http://"+ranker.addr+"/v1/executions/"+exec+"/leaderboard", &lb); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  %-8s %-4s %-6s %-10s %-10s %s\n", "position", "rank", "team", "best", "best round", "rounds")
	for _, r := range lb.Teams {
		fmt.Fprintf(stdout, "  %-8d %-4d %-6s %-10.2f %-10d %d\n", r.Position, r.Rank, r.TeamName, r.BestScore, r.BestRound, r.Rounds)
	}
	fmt.Fprintf(stdout, "  evaluations committed up to sequence %d; tournament played in %s\n", lb.EvaluationsSeq, time.Since(start).Round(time.Millisecond))

	step(stdout, "archive: every prompt record copied into ClickHouse")
	if err := waitArchived(ctx, js, stdout); err != nil {
		return err
	}

	// The auditor's check: every recorded prompt is what its request renders again, as of the
	// evaluations it was made from (read from the archive).
	step(stdout, "audit: podium prompts verify --all --execution "+exec)
	if err := verifyPrompts(ctx, *binDir, env, exec, stdout); err != nil {
		return err
	}
	if *serve {
		step(stdout, fmt.Sprintf("the console is at http://%s/executions/%s; everything keeps running until Ctrl-C", console.addr, exec))
		fmt.Fprintf(stdout, "  to use bin/podium against it from another terminal:\n  export NATS_URL=%s CLICKHOUSE_ADDR=%s CLICKHOUSE_DATABASE=demo\n", ns.ClientURL(), ch.Addr)
		<-ctx.Done()
	} else {
		fmt.Fprintf(stdout, "\n  (make demo SERVE=1, or bin/demo --serve, keeps the console at http://%s up until Ctrl-C)\n", console.addr)
	}
	step(stdout, "stopping everything")
	return nil
}

// waitArchived waits until the archiver has stored every record PROMPTS holds.
func waitArchived(ctx context.Context, js jetstream.JetStream, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		cons, err := js.Consumer(ctx, events.StreamPrompts, events.ConsumerArchiver)
		if err == nil {
			info := cons.CachedInfo()
			if info.NumPending == 0 && info.NumAckPending == 0 {
				fmt.Fprintf(w, "  every record through PROMPTS sequence %d is archived; the audit below reads them from ClickHouse\n", info.AckFloor.Stream)
				return nil
			}
		}
		if retry.Sleep(ctx, 100*time.Millisecond) != nil {
			return fmt.Errorf("the archiver did not store every prompt record within 30s: %v", err)
		}
	}
}

func step(w io.Writer, s string) { fmt.Fprintf(w, "\n== %s\n", s) }

// verifyPrompts runs the podium CLI's audit of every prompt of the execution.
func verifyPrompts(ctx context.Context, binDir string, env []string, execution string, w io.Writer) error {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "podium"), "prompts", "verify", "--all", "--execution", execution)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("podium prompts verify: %w", err)
	}
	return nil
}

// synthetic makes a team's submission and score for a round: deterministic, different per team,
// mostly improving over rounds, with a tie in round 2 to show shared ranks.
func synthetic(exec string, tm team, round int, at time.Time) events.EvaluationCompleted {
	h := sha256.Sum256([]byte(tm.id))
	base := 55 + float64(binary.BigEndian.Uint16(h[:2])%30)
	score := base + float64(round-1)*float64(3+binary.BigEndian.Uint16(h[2:4])%6)
	if round == 2 && (tm.id == "team-alpha" || tm.id == "team-gamma") {
		score = 77.5
	}
	return events.EvaluationCompleted{
		ExecutionID: exec, TeamID: tm.id, TeamName: tm.name, RoundNumber: round,
		Submission: events.Submission{Format: "md", Content: fmt.Sprintf("# %s, attempt %d\n%s proposes \"Steady\": a pipeline that turns <incidents> & pages into dashboards nobody needs to watch.", tm.name, round, tm.name)},
		Evaluation: events.Scores{OverallScore: score, Feedback: fmt.Sprintf("Round %d: sharpen the pitch's first sentence.", round),
			Metrics: []events.Metric{
				{MetricName: "Clarity", Score: score - 2, EvaluatorComment: "readable"},
				{MetricName: "Originality", Score: score + 1.5, EvaluatorComment: "fresh angle"},
			}},
		EvaluatedAt: at,
	}
}

func publish(ctx context.Context, js jetstream.JetStream, subject, id, eventType string, at time.Time, data any) error {
	body, err := events.Marshal(id, "orchestrator/demo", eventType, at, data)
	if err != nil {
		return err
	}
	_, err = events.Publish(ctx, js, subject, id, body)
	return err
}

func next(ctx context.Context, cons jetstream.Consumer) (jetstream.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, err
		}
		for msg := range batch.Messages() {
			return msg, nil
		}
		if ctx.Err() != nil {
			return nil, errors.New("no prompt within 30s; see the service logs")
		}
	}
}

// printAnswer prints a prompt cut to lines (0: whole).
func printAnswer(w io.Writer, msg jetstream.Msg, lines int) error {
	var env events.Envelope
	if err := json.Unmarshal(msg.Data(), &env); err != nil {
		return err
	}
	if env.Type == events.TypePromptFailed {
		var pf events.PromptFailed
		_ = json.Unmarshal(env.Data, &pf)
		return fmt.Errorf("prompt.failed for %s round %d: %s: %s", pf.TeamID, pf.RoundNumber, pf.Code, pf.Message)
	}
	var pc events.PromptComposed
	if err := json.Unmarshal(env.Data, &pc); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n-- prompt for %s, round %d (%s@%d, ~%d tokens, sha256 %s…)\n", pc.TeamName, pc.RoundNumber, pc.Template.Name, pc.Template.Version, pc.TokenEstimate, pc.PromptSHA256[:12])
	all := strings.Split(pc.Prompt, "\n")
	for i, l := range all {
		if lines > 0 && i == lines {
			fmt.Fprintf(w, "   | … %d more lines\n", len(all)-lines)
			break
		}
		fmt.Fprintf(w, "   | %s\n", l)
	}
	return nil
}

func waitForRounds(ctx context.Context, addr, exec string, want int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var lb struct {
			Teams []events.LeaderboardRow `json:"teams"`
		}
		if err := getJSON(ctx, "http://"+addr+"/v1/executions/"+exec+"/leaderboard", &lb); err != nil {
			return err
		}
		got := 0
		for _, r := range lb.Teams {
			got += r.Rounds
		}
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ranker holds %d of %d evaluations after 30s", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// service is a running ranker, composer or console process.
type service struct {
	name string
	cmd  *exec.Cmd
	addr string
	done chan error
}

// startService runs bin with its HTTP address in addrVar: want when that is free, else a free
// loopback port.
func startService(ctx context.Context, bin, dir string, env []string, addrVar, want string) (*service, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s: %w (build it with `make build`)", bin, err)
	}
	var l net.Listener
	err := errors.New("no address asked for")
	if want != "" {
		l, err = net.Listen("tcp", want)
	}
	if err != nil {
		l, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	name := filepath.Base(bin)
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	s := &service{name: name, addr: addr, done: make(chan error, 1)}
	s.cmd = exec.Command(bin)
	s.cmd.Env = append(env, addrVar+"="+addr)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() { s.done <- s.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case err := <-s.done:
			log, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			return nil, fmt.Errorf("%s exited at start (%v):\n%s", name, err, log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = s.cmd.Process.Kill()
			return nil, fmt.Errorf("%s not ready after 30s", name)
		}
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (s *service) stop(w io.Writer) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		if err != nil {
			fmt.Fprintf(w, "  %s exited: %v\n", s.name, err)
			return
		}
		fmt.Fprintf(w, "  %s stopped cleanly\n", s.name)
	case <-time.After(40 * time.Second):
		_ = s.cmd.Process.Kill()
		fmt.Fprintf(w, "  %s killed after 40s\n", s.name)
	}
}
