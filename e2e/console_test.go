package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// hostile are texts a team or an evaluator may write (model output): each must reach the page
// as text, verbatim, and none may run, load or navigate.
var hostile = []string{
	`<script>alert(1)</script>`,
	`"><img src=x onerror=alert(2)>`,
	`javascript:alert(3)`,
	`<a href="javascript:alert(4)">click</a>`,
}

// consoleTeam is one team of the browser test's tournament. Names carry markup; ids stay
// identifiers, as the contract wants.
type consoleTeam struct {
	id, name string
	scores   [3]float64 // rounds 1 to 3
}

var consoleTeams = []consoleTeam{
	{"alpha", "Alpha <b>Bold</b>", [3]float64{70, 75, 72}},
	{"bravo", "Bravo", [3]float64{60, 80.5, 65}},
	{"charlie", `Charlie "><img src=x onerror=alert(5)>`, [3]float64{50, 55, 58.25}},
}

const (
	payloadTeam, payloadRound = "bravo", 2   // the evaluation whose texts carry every hostile string
	bigTeam, bigRound         = "charlie", 2 // the ~900 KB submission
)

// bigSubmission is ~900 KB of distinct lines: under the 1 MiB event limit, over the 64 KiB a
// round page shows.
func bigSubmission() string {
	var b strings.Builder
	for i := 0; b.Len() < 900_000; i++ {
		fmt.Fprintf(&b, "%s round %d line %06d: a long answer that goes on and on.\n", bigTeam, bigRound, i)
	}
	return b.String()
}

// consoleEvaluation is one evaluation of the tournament, with the hostile texts or the big
// submission where they belong.
func consoleEvaluation(exec string, tm consoleTeam, round int, score float64, big string) events.EvaluationCompleted {
	ev := evaluation(exec, tm.id, tm.name, round, score, fmt.Sprintf("answer of %s round %d", tm.id, round), t0.Add(time.Duration(round)*time.Minute))
	switch {
	case tm.id == payloadTeam && round == payloadRound:
		all := strings.Join(hostile, "\n")
		ev.Submission.Content = "Submission with payloads:\n" + all + "\n"
		ev.Evaluation.Feedback = "Feedback with payloads:\n" + all
		for i, h := range hostile { // metric names are unique within an evaluation
			ev.Evaluation.Metrics = append(ev.Evaluation.Metrics, events.Metric{MetricName: fmt.Sprintf("Safety%d", i+1), Score: score, EvaluatorComment: "comment " + h})
		}
	case tm.id == bigTeam && round == bigRound:
		ev.Submission.Content = big
	}
	return ev
}

// browser starts a headless chromium for the test, or skips it where none is installed (never
// under CI, where make test installs one).
func browser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("CI") == "" {
			t.Skip("no chromium or chromium-browser on PATH: install chromium to run the console's browser test")
		}
		t.Fatal("no chromium or chromium-browser on PATH under CI (make test installs it)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1280, 900))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first Run starts the browser for the context's whole life: no timeout on its context,
	// but a bound on the wait, so a browser that never answers fails the test.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("start %s: %v", path, err)
		}
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("%s did not start within 60s", path)
	}
	return ctx
}

// within runs the actions with a bound, so a page that never shows what is waited for fails the
// test instead of hanging it.
func within(t *testing.T, ctx context.Context, d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page, bounded.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// navigate loads a page, waits for its load event and checks it was served 200 under the
// console's policy: scripts of its own origin only, so a text that escaped html/template still
// could not run.
func navigate(t *testing.T, ctx context.Context, u string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := chromedp.Run(tctx, chromedp.NavigateResponse(u))
	if err != nil {
		t.Fatalf("open %s: %v", u, err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("open %s: status %d", u, resp.Status)
	}
	var csp string
	for k, v := range resp.Headers {
		if strings.EqualFold(k, "Content-Security-Policy") {
			csp = fmt.Sprint(v)
		}
	}
	if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("%s: Content-Security-Policy %q, want script-src 'self' and nothing inline", u, csp)
	}
}

// pageWatch records what the browser did that a hostile text could cause.
type pageWatch struct {
	mu       sync.Mutex
	requests []string // every request URL
	bad      []string // requests a payload would make: .../x, javascript:
	dialogs  []string
	console  []string // console errors and warnings (a CSP violation is one)
}

func (w *pageWatch) snapshot() (requests, bad, dialogs, console []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.requests...), append([]string(nil), w.bad...), append([]string(nil), w.dialogs...), append([]string(nil), w.console...)
}

// watch listens to the tab: dialogs (dismissed at once, so the page does not block), requests,
// console errors.
func watch(t *testing.T, ctx context.Context) *pageWatch {
	t.Helper()
	w := &pageWatch{}
	err := chromedp.Listen(ctx, func(ev any) {
		// This runs in the tab's read loop: record and return, no command here.
		switch ev := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			w.mu.Lock()
			w.dialogs = append(w.dialogs, fmt.Sprintf("%s %q on %s", ev.Type, ev.Message, ev.URL))
			w.mu.Unlock()
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false}) //nolint:errcheck // best effort: the test fails anyway
		case *network.EventRequestWillBeSent:
			u := ev.Request.URL
			w.mu.Lock()
			w.requests = append(w.requests, u)
			if pu, err := url.Parse(u); strings.HasPrefix(strings.ToLower(u), "javascript:") || err == nil && strings.HasSuffix(pu.Path, "/x") {
				w.bad = append(w.bad, u)
			}
			w.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			// The console serves no favicon: the browser's own request for one is no error of a page.
			if (m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException()) && !strings.HasSuffix(m.URL, "/favicon.ico") {
				w.mu.Lock()
				w.console = append(w.console, m.String()+" ("+m.URL+")")
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// boardRowView is a leaderboard row as the page shows it.
type boardRowView struct {
	Team   string `json:"team"`
	Rank   string `json:"rank"`
	Best   string `json:"best"`
	Rounds string `json:"rounds"`
	Name   string `json:"name"`
	Href   string `json:"href"`
}

const readBoard = `Array.from(document.querySelectorAll('#leaderboard tbody tr[data-team]')).map(tr => ({
	team: tr.dataset.team,
	rank: tr.querySelector('td.rank').textContent,
	best: tr.querySelector('td.best').textContent,
	rounds: tr.querySelector('td.rounds').textContent,
	name: tr.querySelector('td.name').textContent,
	href: tr.querySelector('a').getAttribute('href'),
}))`

// pageSafety is what a hostile text would leave in the DOM had it escaped html/template.
type pageSafety struct {
	Scripts  []string `json:"scripts"`  // src of every script element
	BadImgs  []string `json:"badImgs"`  // img whose src ends in /x
	Imgs     int      `json:"imgs"`     // img elements at all (the console has none)
	Handlers int      `json:"handlers"` // elements with an onerror attribute
	JSLinks  int      `json:"jsLinks"`  // links to javascript:
	Bold     int      `json:"bold"`     // b elements (a team name's <b>)
}

const readSafety = `({
	scripts: Array.from(document.querySelectorAll('script')).map(s => s.src),
	badImgs: Array.from(document.querySelectorAll('img')).map(i => i.src).filter(s => s.endsWith('/x')),
	imgs: document.querySelectorAll('img').length,
	handlers: document.querySelectorAll('[onerror]').length,
	jsLinks: Array.from(document.querySelectorAll('a[href]')).filter(a => a.href.trim().toLowerCase().startsWith('javascript:')).length,
	bold: document.querySelectorAll('b').length,
})`

// checkSafe checks the page now loaded holds no element a payload would have made, and that
// the only script is the console's own.
func checkSafe(t *testing.T, ctx context.Context, base, where string) {
	t.Helper()
	s := eval[pageSafety](t, ctx, readSafety)
	if len(s.Scripts) != 1 || s.Scripts[0] != base+"/static/console.js" {
		t.Errorf("%s: scripts %q, want only %s/static/console.js", where, s.Scripts, base)
	}
	if len(s.BadImgs) > 0 || s.Imgs > 0 || s.Handlers > 0 || s.JSLinks > 0 || s.Bold > 0 {
		t.Errorf("%s: markup from a team's or evaluator's text became elements: %+v", where, s)
	}
}

// TestConsoleInTheBrowser plays a tournament with hostile texts and a 900 KB submission, then
// reads it in chromium as an operator would: the board matches the ranker's, the prompt shown is
// the one published byte for byte and verifies, no text a team or evaluator wrote runs or
// loads anything, a cut text is served whole, and the page follows a new evaluation live.
func TestConsoleInTheBrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")
	con := e.start("console")
	base := "http://" + con.addr
	const exec = "console-e2e"
	big := bigSubmission()

	// 3 teams x 3 rounds: requests, their prompts, then the evaluations, round by round.
	for r := 1; r <= 3; r++ {
		for _, tm := range consoleTeams {
			e.requestRound(fmt.Sprintf("req-%s-%d", tm.id, r), events.RoundRequested{ExecutionID: exec, TeamID: tm.id, TeamName: tm.name,
				RoundNumber: r, UserPrompt: "Write the best answer.\r\nKeep its line ends:\rexactly as sent.", MaxRounds: 4}, t0.Add(time.Duration(r)*time.Minute-time.Second))
		}
		got := e.answers("prompt.*."+exec+".*", r*len(consoleTeams), 60*time.Second)
		for _, tm := range consoleTeams {
			if a := got[fmt.Sprintf("req-%s-%d", tm.id, r)]; !a.ok() {
				t.Fatalf("%s round %d: %s %+v", tm.id, r, a.subject, a.failed)
			}
		}
		for _, tm := range consoleTeams {
			e.publishEvaluation(fmt.Sprintf("ev-%s-%d", tm.id, r), consoleEvaluation(exec, tm, r, tm.scores[r-1], big))
		}
	}
	lb := waitRanked(t, ranker, exec, 3*len(consoleTeams))

	w := watch(t, ctx)
	shots := screenshotDir(t)

	// The board: the ranker's teams, in position order.
	navigate(t, ctx, base+"/executions/"+exec)
	rows := eval[[]boardRowView](t, ctx, readBoard)
	if len(rows) != len(lb.Teams) {
		t.Fatalf("the page shows %d rows, the ranker %d: %+v", len(rows), len(lb.Teams), rows)
	}
	for i, want := range lb.Teams {
		got := rows[i]
		if got.Team != want.TeamID || got.Rank != strconv.Itoa(want.Rank) || got.Best != strconv.FormatFloat(want.BestScore, 'f', -1, 64) ||
			got.Rounds != strconv.Itoa(want.Rounds) || got.Name != want.TeamName {
			t.Errorf("row %d: page %+v, ranker %+v", i+1, got, want)
		}
		if href := fmt.Sprintf("/executions/%s/teams/%s/rounds/%d", exec, want.TeamID, want.BestRound); got.Href != href {
			t.Errorf("row %d: the team's link goes to %s, want its best round %s", i+1, got.Href, href)
		}
	}
	checkSafe(t, ctx, base, "execution page")
	if top := eval[string](t, ctx, `document.querySelector('#top').textContent`); !strings.Contains(top, hostile[0]) {
		t.Errorf("the top submission (%s round %d) does not show its text: %q", payloadTeam, payloadRound, top)
	}
	for _, sel := range []string{"#grid", "#chart", "#top"} {
		if !eval[bool](t, ctx, fmt.Sprintf(`document.querySelector(%q) !== null`, sel)) {
			t.Errorf("the execution page has no %s", sel)
		}
	}

	// The other pages: none lets a text become markup either.
	for _, path := range []string{"/", "/templates", "/deadletters"} {
		navigate(t, ctx, base+path)
		checkSafe(t, ctx, base, path)
	}
	navigate(t, ctx, base+"/executions/"+exec)

	// The leader's link leads to its best round; its prompt is the published one, byte for byte.
	leader := lb.Teams[0]
	within(t, ctx, 30*time.Second, "click the leader", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS("#leaderboard tbody tr[data-team] a")))(ctx, tg)
		return err
	}))
	wantPath := fmt.Sprintf("/executions/%s/teams/%s/rounds/%d", exec, leader.TeamID, leader.BestRound)
	if loc := eval[string](t, ctx, `location.pathname`); loc != wantPath {
		t.Fatalf("the leader's link led to %s, want %s", loc, wantPath)
	}
	recs, err := audit.Source{JS: e.js}.Records(t.Context(), audit.Query{ExecutionID: exec, TeamID: leader.TeamID})
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := audit.Latest(recs, leader.BestRound)
	if !ok {
		t.Fatalf("no PROMPTS record of %s round %d", leader.TeamID, leader.BestRound)
	}
	// textContent: the prompt may sit in a closed <details>, which innerText would not read.
	shown := eval[string](t, ctx, `document.getElementById('prompt').textContent`)
	sum := sha256.Sum256([]byte(shown))
	if shown != rec.Data.Prompt || hex.EncodeToString(sum[:]) != rec.Data.PromptSHA256 {
		t.Errorf("#prompt differs from the published prompt (%d bytes shown, %d published; sha256 %x, recorded %s)\nfirst difference at byte %d",
			len(shown), len(rec.Data.Prompt), sum, rec.Data.PromptSHA256, firstDiff(shown, rec.Data.Prompt))
	}
	if got := eval[string](t, ctx, `document.getElementById('sha256').textContent`); got != rec.Data.PromptSHA256 {
		t.Errorf("#sha256 %q, want %s", got, rec.Data.PromptSHA256)
	}
	within(t, ctx, 60*time.Second, "verify", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.ID("verify")))(ctx, tg)
		return err
	}), chromedp.WaitReady(chromedp.CSS("#verdict")))
	if v := eval[[]string](t, ctx, `[document.getElementById('verdict').className, document.getElementById('verdict').textContent]`); v[0] != "verdict ok" {
		t.Errorf("verify of %s round %d: class %q: %s", leader.TeamID, leader.BestRound, v[0], v[1])
	}

	// The round of the payloads, and the next one, whose prompt carries them in the history.
	roundURL := func(team string, r int) string {
		return fmt.Sprintf("%s/executions/%s/teams/%s/rounds/%d", base, exec, team, r)
	}
	navigate(t, ctx, roundURL(payloadTeam, payloadRound))
	for _, c := range []struct{ sel, where string }{
		{"#submission", "submission"},
		{"#feedback", "feedback"},
		{"table.metrics", "metric comments"},
	} {
		text := eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q).textContent`, c.sel))
		for _, h := range hostile {
			if !strings.Contains(text, h) {
				t.Errorf("%s round %d: the %s does not show %q verbatim: %q", payloadTeam, payloadRound, c.where, h, text)
			}
		}
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('table.metrics td.comment').length`); n != 1+len(hostile) {
		t.Errorf("%d metric comments shown, want %d", n, 1+len(hostile))
	}
	checkSafe(t, ctx, base, "payload round page")
	writeShot(t, ctx, shots, "round.png")
	navigate(t, ctx, roundURL(payloadTeam, payloadRound+1))
	prompt := eval[string](t, ctx, `document.getElementById('prompt').textContent`)
	for _, h := range hostile {
		if !strings.Contains(prompt, h) {
			t.Errorf("%s round %d: the prompt does not show %q of the previous round verbatim", payloadTeam, payloadRound+1, h)
		}
	}
	checkSafe(t, ctx, base, "round page after the payloads")

	// The 900 KB submission: cut on the page, whole as text/plain behind the link.
	navigate(t, ctx, roundURL(bigTeam, bigRound))
	cut := eval[string](t, ctx, `(document.querySelector('#evaluation p.cut a') || {href: ''}).href`)
	if cut == "" {
		t.Fatalf("%s round %d: the %d-byte submission is not cut (no p.cut link)", bigTeam, bigRound, len(big))
	}
	if want := fmt.Sprintf("%s/text/submission/%s/%s/%d", base, exec, bigTeam, bigRound); cut != want {
		t.Errorf("the cut link goes to %s, want %s", cut, want)
	}
	if part := eval[string](t, ctx, `document.getElementById('submission').textContent`); len(part) > 64<<10 || !strings.HasPrefix(big, part) {
		t.Errorf("the shown submission is %d bytes, want a prefix of at most 64 KiB", len(part))
	}
	resp, err := http.Get(cut)
	if err != nil {
		t.Fatal(err)
	}
	whole, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/plain") || string(whole) != big {
		t.Errorf("GET %s: %d %s, %d bytes (want text/plain, the whole %d bytes; same: %v)", cut, resp.StatusCode, ct, len(whole), len(big), string(whole) == big)
	}

	// Live: a round-4 evaluation lifts the last team to the top; the open page follows it
	// without a reload.
	last := lb.Teams[len(lb.Teams)-1]
	const newBest = 99.25
	navigate(t, ctx, base+"/executions/"+exec)
	within(t, ctx, 30*time.Second, "the live stream opens", chromedp.WaitReady(chromedp.CSS(`body[data-live-open="1"]`)))
	eval[chromedp.Void](t, ctx, `window.__marker = 42`)
	var lastTeam consoleTeam
	for _, tm := range consoleTeams {
		if tm.id == last.TeamID {
			lastTeam = tm
		}
	}
	e.publishEvaluation("ev-"+last.TeamID+"-4", consoleEvaluation(exec, lastTeam, 4, newBest, big))
	waitBoard(t, ranker, exec, func(lb leaderboard) bool {
		return len(lb.Teams) > 0 && lb.Teams[0].TeamID == last.TeamID && lb.Teams[0].BestScore == newBest
	})
	committed := time.Now()
	want := strconv.FormatFloat(newBest, 'f', -1, 64)
	readBest := fmt.Sprintf(`(document.querySelector('#leaderboard tr[data-team=%q] td.best') || {textContent: ''}).textContent`, last.TeamID)
	for {
		got := eval[string](t, ctx, readBest)
		if got == want {
			t.Logf("live update: %s's best score shown %s after the ranker's API showed it", last.TeamID, time.Since(committed).Round(time.Millisecond))
			break
		}
		if time.Since(committed) > 2*time.Second {
			t.Fatalf("live update: %s's best is still %q 2s after the ranker's API showed %s", last.TeamID, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m := eval[int](t, ctx, `window.__marker === 42 ? 1 : 0`); m != 1 {
		t.Errorf("window.__marker is gone: the page was reloaded, not updated")
	}
	if n, _ := strconv.Atoi(eval[string](t, ctx, `document.body.getAttribute('data-updates') || '0'`)); n < 1 {
		t.Errorf("body data-updates = %d, want at least 1", n)
	}
	checkSafe(t, ctx, base, "execution page after the live update")
	writeShot(t, ctx, shots, "execution.png")

	requests, bad, dialogs, console := w.snapshot()
	if len(dialogs) > 0 {
		t.Errorf("dialogs opened: %q", dialogs)
	}
	if len(bad) > 0 {
		t.Errorf("requests a payload would make: %q", bad)
	}
	t.Logf("%d requests of the browser, e.g. %q", len(requests), requests[:min(len(requests), 5)])
	if len(console) > 0 {
		t.Errorf("console errors (a CSP violation is one): %q", console)
	}
}

// waitBoard polls the ranker's leaderboard of exec until done says so (60 s at most). It polls
// every 10 ms rather than with testenv.WaitFor's backoff: the live-update test times the page
// from the moment the API shows the change.
func waitBoard(t *testing.T, ranker *proc, exec string, done func(leaderboard) bool) leaderboard {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var lb leaderboard
		status := ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &lb)
		if status == http.StatusOK && done(lb) {
			return lb
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ranker's leaderboard of %s never got there: %d %+v", exec, status, lb)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitRanked waits until the ranker's leaderboard of exec counts n evaluated rounds in all.
func waitRanked(t *testing.T, ranker *proc, exec string, n int) leaderboard {
	t.Helper()
	return waitBoard(t, ranker, exec, func(lb leaderboard) bool {
		total := 0
		for _, row := range lb.Teams {
			total += row.Rounds
		}
		return total == n
	})
}

// firstDiff is the offset of the first byte where a and b differ.
func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// screenshotDir is where screenshots go: PODIUM_SCREENSHOTS, or a fixed folder under the
// temporary directory, kept after the test (test artefacts).
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PODIUM_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "podium-console-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writeShot saves a full-page PNG of the page now shown.
func writeShot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)) // 100: PNG, not JPEG
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("test artefact: screenshot %s (%d bytes)", path, len(png))
}

// TestConsoleRefusesOpenBindWithoutToken: on an address other than loopback the console needs
// a credential; with one, every request but the probes must carry it.
func TestConsoleRefusesOpenBindWithoutToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker") // creates the tables the executions page reads
	openAddr := func() (open, local string) {
		_, port, err := net.SplitHostPort(freeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		return "0.0.0.0:" + port, "127.0.0.1:" + port
	}

	open, _ := openAddr()
	p := e.spawn("console", "CONSOLE_ADDR="+open)
	select {
	case err := <-p.done:
		p.done <- err // the cleanup waits for it too
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 || !strings.Contains(p.logs.String(), "CONSOLE_AUTH_TOKEN") {
			t.Errorf("console on %s without a token: exit %v, want non-zero with an error naming CONSOLE_AUTH_TOKEN\n%s", open, err, p.logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("console on %s without a token still runs after 30s\n%s", open, p.logs)
	}

	open, local := openAddr()
	p = e.spawn("console", "CONSOLE_ADDR="+open, "CONSOLE_AUTH_TOKEN=s3cret")
	// The probes are open: wait on them without a credential.
	for _, probe := range []string{"/healthz", "/readyz"} {
		p.waitOK(t, "http://"+local+probe)
	}
	cases := []struct {
		name, path string
		auth       func(*http.Request)
		want       int
	}{
		{"no credential", "/", func(*http.Request) {}, http.StatusUnauthorized},
		{"wrong bearer", "/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer wrong") }, http.StatusUnauthorized},
		{"wrong basic password", "/", func(r *http.Request) { r.SetBasicAuth("any", "wrong") }, http.StatusUnauthorized},
		{"bearer token", "/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") }, http.StatusOK},
		{"token as basic password", "/", func(r *http.Request) { r.SetBasicAuth("any", "s3cret") }, http.StatusOK},
		{"metrics stay open, as the probes", "/metrics", func(*http.Request) {}, http.StatusOK},
	}
	for _, c := range cases {
		req, err := http.NewRequest(http.MethodGet, "http://"+local+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.auth(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: GET %s: %d, want %d: %.200s", c.name, c.path, resp.StatusCode, c.want, body)
		}
		if c.want == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", c.name)
		}
	}
}

// consoleSubs is the number of NATS subscriptions of the console's connection.
func consoleSubs(t *testing.T, e *env) int {
	t.Helper()
	cz, err := e.ns.Connz(&server.ConnzOptions{Subscriptions: true})
	if err != nil {
		t.Fatal(err)
	}
	n, found := 0, 0
	for _, c := range cz.Conns {
		if c.Name == "console" {
			n += len(c.Subs)
			found++
		}
	}
	if found != 1 {
		t.Fatalf("%d NATS connections named console, want 1", found)
	}
	return n
}

// rssKiB is a process's resident memory.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kib
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// waitGauge polls a series of p until it is want, for limit at most.
func waitGauge(t *testing.T, p *proc, series string, want float64, limit time.Duration) {
	t.Helper()
	testenv.WaitFor(t, limit, fmt.Sprintf("%s = %v", series, want), func() (bool, string) {
		got := p.metric(t, series)
		return got == want, fmt.Sprint(got)
	})
}

// TestConsoleLiveViewersShareOneSubscription: 100 live pages cost the console no NATS
// subscription of their own and little memory, and one evaluation reaches every one of them.
func TestConsoleLiveViewersShareOneSubscription(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	con := e.start("console")
	const exec, viewers = "live-e2e", 100
	subsBefore := consoleSubs(t, e)
	rssBefore := rssKiB(t, con.cmd.Process.Pid)

	tr := &http.Transport{MaxIdleConnsPerHost: viewers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		updated atomic.Int32 // streams that received an update
		wg      sync.WaitGroup
	)
	allUpdated := make(chan struct{})
	for range viewers {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+con.addr+"/live?execution="+exec, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("GET /live: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		wg.Go(func() {
			defer resp.Body.Close()
			// Server-Sent Events: fields up to a blank line make one event.
			sc := bufio.NewScanner(resp.Body)
			event, seen := "", false
			for sc.Scan() {
				line := sc.Text()
				if name, ok := strings.CutPrefix(line, "event:"); ok {
					event = strings.TrimSpace(name)
					continue
				}
				if line != "" {
					continue
				}
				if event == "update" && !seen {
					seen = true
					if updated.Add(1) == viewers {
						close(allUpdated)
					}
				}
				event = ""
			}
		})
	}
	waitGauge(t, con, "console_live_viewers", viewers, 10*time.Second)
	t.Logf("the console's NATS connection holds %d subscriptions with no viewer", subsBefore)
	if subs := consoleSubs(t, e); subs != subsBefore {
		t.Errorf("the console holds %d NATS subscriptions with %d viewers, %d with none", subs, viewers, subsBefore)
	}

	e.publishEvaluation("ev-live-1", evaluation(exec, "t1", "One", 1, 42, "live answer", t0))
	waitBoard(t, ranker, exec, func(lb leaderboard) bool { return len(lb.Teams) == 1 })
	select {
	case <-allUpdated:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d live streams received an update within 10s of the ranker committing", updated.Load(), viewers)
	}
	rssWith := rssKiB(t, con.cmd.Process.Pid)
	t.Logf("console VmRSS: %d KiB with no viewer, %d KiB with %d (growth %d KiB)", rssBefore, rssWith, viewers, rssWith-rssBefore)
	if growth := rssWith - rssBefore; growth >= 32<<10 {
		t.Errorf("%d live viewers grew the console's RSS by %d KiB, want under 32 MiB", viewers, growth)
	}
	if subs := consoleSubs(t, e); subs != subsBefore {
		t.Errorf("the console holds %d NATS subscriptions after the update, %d before", subs, subsBefore)
	}

	cancel()
	wg.Wait()
	waitGauge(t, con, "console_live_viewers", 0, 10*time.Second)
}
