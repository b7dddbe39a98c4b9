// Package experiment tells a template author which version of a template helps teams, and says so
// only where the data can: a comparison is causal where teams of the same executions were
// randomized between the versions by a split label (compose.Split), and compare analyses those
// teams with the execution as the block, one outcome per team. Everything else gets figures, not
// verdicts. The method, what it concludes and what it refuses to say, is docs/templates.md
// ("Experiments: which version helps teams").
package experiment

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Prompt is one answer the template's requests got: a prompt a version served (composed), or a
// request that failed (Failed): counted against the version its prompt.failed names (with the
// label and split that assigned it), or, when it names none (it failed before a version was
// chosen, or was recorded before prompt.failed said), against the version the team was served.
type Prompt struct {
	ExecutionID, TeamID string
	Round, Version      int
	// Label is the registry label the request resolved through; "" for an explicit version,
	// latest, or a template outside the registry: never randomized. Split is that label's versions
	// and weights when it assigned the version (events.TemplateRef.Split; "" for a record before
	// Podium kept it).
	Label, Split string
	Failed       bool
	// Order is the request's score_order: which scores are better.
	Order events.ScoreOrder
	// MaxRounds is the request's max_rounds (0: not sent): an execution is finished once a team
	// of it was served its last round.
	MaxRounds int
}

// The minimums below which a comparison says "not enough data": teams of each version in the
// randomized executions, and the degrees of freedom of the variance behind the interval.
const (
	MinTeams = 5
	MinDF    = 4
	// MinExecutions is the fewest randomized executions from which a verdict is said to hold
	// beyond them: how much the effect varies between executions is estimated from their own
	// differences (MinExecutions-1 degrees of freedom).
	MinExecutions = 4
	// Alpha is the level of each family of claims together: the verdicts on scores (Holm over
	// the comparisons made), failing more (Bonferroni over them), and attrition (each block's
	// versions compared): three families, each at Alpha, not one.
	Alpha = 0.05
)

// Scopes of a verdict (Comparison.Scope).
const (
	ScopeBeyond = "executions like these"
	ScopeThese  = "these executions only"
)

// ExecutionDifference is one execution's own difference between two versions.
type ExecutionDifference struct {
	Execution  string  `json:"execution"`
	Difference float64 `json:"difference"`
	Teams      int     `json:"teams"`
}

// Verdicts.
const (
	Better = "better"
	Worse  = "worse"
	// NoDifference: the interval lies within the margin the author gave (Options.Margin): an
	// equivalence shown, not only no difference found.
	NoDifference = "no difference"
	// Inconclusive: the interval holds 0 and reaches beyond the margin (with no margin given,
	// always): the data neither show a difference nor rule one out.
	Inconclusive  = "inconclusive"
	NotEnoughData = "not enough data"
	NotRandomized = "not randomized"
	// Interim: an execution the comparison stands on is not finished (no team was served its
	// max_rounds yet). A verdict read after every round, each time at 5%, would be wrong far more
	// often than 5% at one look or another; so better, worse and no difference wait for the end,
	// and meanwhile the estimate and its interval are given as they stand.
	Interim = "interim"
	// FailsMore: the version's requests failed clearly more often than the baseline's (the
	// teams' shares of failed requests, Welch within executions, Bonferroni over the
	// comparisons): a request that failed got no prompt, whatever the scores of the others say.
	FailsMore = "fails more"
	// AttritionDiffers: the versions lost teams before their executions' last round at clearly
	// different rates (Fisher's exact test, p < Alpha): the teams that stayed are not comparable,
	// and the attrition is itself a difference between the versions.
	AttritionDiffers = "attrition differs"
)

// Interval is a confidence interval, [low, high].
type Interval [2]float64

// String writes an interval as [low, high].
func (i Interval) String() string { return fmt.Sprintf("[%.2f, %.2f]", i[0], i[1]) }

// Figures are what one version did, descriptively: every team served it counts.
type Figures struct {
	Version     int `json:"version"`
	Teams       int `json:"teams"`       // (execution, team) pairs served it
	Executions  int `json:"executions"`  // distinct
	Prompts     int `json:"prompts"`     // composed
	Failed      int `json:"failed"`      // prompt.failed of its teams
	Unevaluated int `json:"unevaluated"` // composed, and no evaluation of that round yet
	// TeamsUnevaluated are its teams with no evaluation of any round it served them: in no
	// estimate, and counted as teams that left in a comparison. TeamsOnlyFailed are those of
	// them whose every request failed (each prompt.failed naming this version): in Teams, and in
	// the failures compared.
	TeamsUnevaluated int `json:"teams_unevaluated"`
	TeamsOnlyFailed  int `json:"teams_only_failed"`
	// Estimate is the mean over its evaluated teams served this version alone of each team's mean
	// score over its rounds (not adjusted for where it stood before, unlike a comparison's
	// outcome), CI its 95% interval clustered by execution (nil below two executions):
	// descriptive, not a comparison.
	Estimate *float64  `json:"estimate"`
	CI       *Interval `json:"ci"`
}

// Mean writes the estimate and its interval, "-" when there is none.
func (f Figures) Mean() string {
	if f.Estimate == nil {
		return "-"
	}
	out := fmt.Sprintf("%.2f", *f.Estimate)
	if f.CI != nil {
		out += " " + f.CI.String()
	}
	return out
}

// Comparison is a version against the baseline.
type Comparison struct {
	Version  int `json:"version"`
	Baseline int `json:"baseline"`
	// Difference is the version's outcome minus the baseline's: with a verdict given or refused
	// for want of data, the blocked estimate over the randomized executions; when not randomized,
	// the difference of the two versions' estimates, descriptive only. Nil when either has none.
	Difference *float64 `json:"difference"`
	// CI is Difference's interval at the level the multiplicity correction leaves it (Holm's
	// step: 1 - Alpha/(comparisons not yet found)), PValue its two-sided p-value as Holm adjusts
	// it (at most 1, never below a smaller p-value's); nil unless the data allow a test.
	CI     *Interval `json:"ci"`
	PValue *float64  `json:"p_value"`
	// Executions and Teams are what the test stood on: the randomized executions with both
	// versions, and their teams of either.
	Executions int    `json:"executions"`
	Teams      int    `json:"teams"`
	Verdict    string `json:"verdict"`
	Reason     string `json:"reason"`

	// Scope says what a better, worse or no difference verdict covers: ScopeBeyond where it holds
	// when the effect's variation between executions is counted (a random effect over the
	// executions), ScopeThese where it holds for these executions only; empty for other verdicts.
	Scope string `json:"scope,omitempty"`
	// ByExecution is each randomized execution's own difference (the version's outcome less the
	// baseline's), with its teams, in execution order.
	ByExecution []ExecutionDifference `json:"by_execution,omitempty"`
	// Failures compares how often the two versions' requests failed (nil when none did, or the
	// versions were not randomized); ScoresVerdict is the verdict on scores that "fails more"
	// replaced (empty otherwise).
	Failures      *Failures `json:"failures"`
	ScoresVerdict string    `json:"scores_verdict,omitempty"`

	est blocked  // the test, before the multiplicity correction
	re  *blocked // the random-effect test over executions; nil below MinExecutions
	// attrition says, for the reason, how many teams of each version left before their
	// execution's last round; empty when none did.
	attrition string
}

// Report is one template's versions and comparisons.
type Report struct {
	// Order is the executions' score_order ("mixed" when they differ: each execution's scores are
	// then taken in its better direction, and the figures are in that orientation).
	Order       string       `json:"score_order"`
	Baseline    int          `json:"baseline"`
	Versions    []Figures    `json:"versions"`
	Comparisons []Comparison `json:"comparisons"`
}

// team is one (execution, team) pair and what it was served.
type team struct {
	exec, id  string
	versions  map[int]bool
	labels    map[string]bool
	firstTime int         // the first round it was served the template
	split     string      // the split that assigned it, as its first prompt records it
	served    map[int]int // round -> the version served
	prompts   map[int]int // by version: composed
	failed    map[int]int // by version: prompt.failed (served)
	unscored  map[int]int // by version: composed, no evaluation of the round yet
	post      []float64   // scores of the rounds it was served (in its execution's better direction)
	pre       []float64   // scores of its rounds before the first it was served
	// rel and relPre are the same rounds' scores less what every team of the execution scored in
	// that round on average: what a comparison reads, so that a team that left early is not
	// measured against rounds it never played (scores rising over rounds would favour the
	// version whose teams stayed).
	rel, relPre []float64
	lastTime    int     // the last round it was served the template
	sign        float64 // +1: higher is better; -1: lower
	// onlyFailed: every request of the team that named this template failed (prompt.failed
	// saying the version it was assigned); it was served nothing.
	onlyFailed bool
}

// version is the team's one version, label its one label; ok false when it was served several
// (a label moved, or weights changed it) or through several labels.
func (t *team) assigned() (version int, label string, ok bool) {
	if len(t.versions) != 1 || len(t.labels) != 1 {
		return 0, "", false
	}
	for v := range t.versions {
		version = v
	}
	for l := range t.labels {
		label = l
	}
	return version, label, label != ""
}

// versionAt is the version the team was served last at or before round (a failed request is
// that version's), or in its first round served when none was before.
func (t *team) versionAt(round int) int {
	best, version := -1, t.served[t.firstTime]
	for r, v := range t.served {
		if r <= round && r > best {
			best, version = r, v
		}
	}
	return version
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// Options are what an author says before reading a comparison.
type Options struct {
	// Baseline is the version every other is compared with (0: the lowest version served).
	Baseline int
	// Margin is the largest difference, in score units, the author would call no difference
	// (0: none given): `no difference` is said only of an interval within (-Margin, +Margin).
	Margin float64
}

// Analyze compares every version with the baseline. rounds are each execution's counted
// evaluations (rank.Reduction.Rounds): a prompt's outcome is the latest evaluation of its team's
// round.
func Analyze(prompts []Prompt, rounds map[string][]rank.RoundScore, opt Options) Report {
	baseline := opt.Baseline
	type key struct{ exec, team string }
	type rkey struct {
		exec, team string
		round      int
	}
	score := map[rkey]float64{}
	type ekey struct {
		exec  string
		round int
	}
	roundSum, roundN := map[ekey]float64{}, map[ekey]int{}
	for exec, rs := range rounds {
		for _, r := range rs {
			score[rkey{exec, r.TeamID, r.Round}] = r.Score
			roundSum[ekey{exec, r.Round}] += r.Score
			roundN[ekey{exec, r.Round}]++
		}
	}
	// relative is a score less its execution-round's mean over every evaluated team.
	relative := func(exec string, round int, s float64) float64 {
		k := ekey{exec, round}
		return s - roundSum[k]/float64(roundN[k])
	}
	ends := map[string]int{}    // each execution's last round served the template
	planned := map[string]int{} // each execution's max_rounds, as its requests said (0: not sent)
	teams := map[key]*team{}
	orders := map[events.ScoreOrder]bool{}
	var failures []Prompt
	for _, p := range prompts {
		if p.Failed {
			failures = append(failures, p)
			continue
		}
		k := key{p.ExecutionID, p.TeamID}
		t := teams[k]
		if t == nil {
			t = &team{exec: p.ExecutionID, id: p.TeamID, versions: map[int]bool{}, labels: map[string]bool{}, firstTime: p.Round, sign: 1,
				served: map[int]int{}, prompts: map[int]int{}, failed: map[int]int{}, unscored: map[int]int{}}
			teams[k] = t
		}
		order := cmp.Or(p.Order, events.Desc)
		orders[order] = true
		if order == events.Asc {
			t.sign = -1
		}
		t.versions[p.Version], t.labels[p.Label] = true, true
		if p.Round <= t.firstTime {
			t.split = p.Split // the weights that first assigned it
		}
		t.firstTime = min(t.firstTime, p.Round)
		t.lastTime = max(t.lastTime, p.Round)
		ends[p.ExecutionID] = max(ends[p.ExecutionID], p.Round)
		planned[p.ExecutionID] = max(planned[p.ExecutionID], p.MaxRounds)
		t.served[p.Round] = p.Version
		t.prompts[p.Version]++
		if s, ok := score[rkey{p.ExecutionID, p.TeamID, p.Round}]; ok {
			t.post = append(t.post, s)
			t.rel = append(t.rel, relative(p.ExecutionID, p.Round, s))
		} else {
			t.unscored[p.Version]++
		}
	}
	for _, p := range failures {
		t := teams[key{p.ExecutionID, p.TeamID}]
		switch {
		case t == nil && p.Version == 0:
			continue // not this template's, as far as anyone can tell
		case t == nil:
			// Every request of the team failed: it was assigned p.Version all the same, and is
			// one of its teams (never evaluated: counted as one that left, and in the failures).
			t = &team{exec: p.ExecutionID, id: p.TeamID, versions: map[int]bool{p.Version: true}, labels: map[string]bool{p.Label: true},
				firstTime: p.Round, lastTime: p.Round, split: p.Split, sign: 1, onlyFailed: true,
				served: map[int]int{}, prompts: map[int]int{}, failed: map[int]int{}, unscored: map[int]int{}}
			teams[key{p.ExecutionID, p.TeamID}] = t
		case t.onlyFailed && p.Version == 0:
			continue // served nothing, so no version to count it against
		case t.onlyFailed:
			if p.Round < t.firstTime {
				t.firstTime, t.split = p.Round, p.Split
			}
			t.lastTime = max(t.lastTime, p.Round)
			t.versions[p.Version], t.labels[p.Label] = true, true
		}
		v := p.Version
		switch {
		case v == 0:
			v = t.versionAt(p.Round) // a failure that names no version is the one served then
		case !t.versions[v]:
			// Assigned another version than it was served (a label moved to a version that
			// failed): the team had two, and is one of each's teams, in neither's comparison.
			t.versions[v], t.labels[p.Label] = true, true
		}
		t.failed[v]++
	}
	for k, t := range teams {
		for _, r := range rounds[k.exec] {
			if r.TeamID == k.team && r.Round < t.firstTime {
				t.pre = append(t.pre, r.Score)
				t.relPre = append(t.relPre, relative(k.exec, r.Round, r.Score))
			}
		}
		for _, xs := range [][]float64{t.post, t.pre, t.rel, t.relPre} {
			for i := range xs {
				xs[i] *= t.sign
			}
		}
	}
	rep := Report{Order: string(events.Desc)}
	if len(orders) > 1 {
		rep.Order = "mixed"
	} else if orders[events.Asc] {
		rep.Order = string(events.Asc)
	}
	sign := 1.0
	if rep.Order == string(events.Asc) {
		sign = -1 // figures in the executions' own units
	}
	ordered := slices.SortedFunc(maps.Values(teams), func(a, b *team) int { return cmp.Or(cmp.Compare(a.exec, b.exec), cmp.Compare(a.id, b.id)) })

	// Descriptive figures: every team served a version counts toward it.
	byVersion := map[int][]*team{}
	for _, t := range ordered {
		for v := range t.versions {
			byVersion[v] = append(byVersion[v], t)
		}
	}
	versions := slices.Sorted(maps.Keys(byVersion))
	if len(versions) == 0 {
		return rep
	}
	if baseline == 0 || byVersion[baseline] == nil {
		baseline = versions[0]
	}
	rep.Baseline = baseline
	estimates := map[int]*float64{}
	for _, v := range versions {
		f := Figures{Version: v, Teams: len(byVersion[v])}
		execs := map[string]bool{}
		byExec := map[string][]float64{} // each team's outcome, by execution
		var outcomes []float64
		for _, t := range byVersion[v] {
			execs[t.exec] = true
			f.Prompts += t.prompts[v]
			f.Failed += t.failed[v]
			f.Unevaluated += t.unscored[v]
			if len(t.post) == 0 {
				f.TeamsUnevaluated++
			}
			if t.onlyFailed {
				f.TeamsOnlyFailed++
			}
			if len(t.versions) == 1 && len(t.post) > 0 {
				y := sign * mean(t.post)
				outcomes = append(outcomes, y)
				byExec[t.exec] = append(byExec[t.exec], y)
			}
		}
		f.Executions = len(execs)
		if len(outcomes) > 0 {
			m := mean(outcomes)
			f.Estimate = &m
			estimates[v] = &m
			f.CI = clusteredInterval(byExec, m, len(outcomes))
		}
		rep.Versions = append(rep.Versions, f)
	}

	// Comparisons: each version against the baseline, within the executions that randomized teams
	// between the two under one split label.
	var tested []int
	for _, v := range versions {
		if v == baseline {
			continue
		}
		c := compare(ordered, v, baseline, ends)
		if c.Difference == nil && estimates[v] != nil && estimates[baseline] != nil {
			d := *estimates[v] - *estimates[baseline]
			c.Difference = &d
		}
		if c.Difference != nil && c.Verdict != NotRandomized {
			d := sign * *c.Difference
			c.Difference = &d
		}
		if c.Verdict == "" {
			tested = append(tested, len(rep.Comparisons))
		}
		rep.Comparisons = append(rep.Comparisons, c)
	}
	// Holm: the comparisons in order of their p-values, the k-th (from 0) of m tested at
	// Alpha/(m-k) while every one before it was found, so that a false "better" or "worse" among
	// them all has at most Alpha's chance, as with Bonferroni (each at Alpha/m), and a version
	// that clearly differs leaves the others a larger share. Its p-value is Holm's adjusted one
	// (never below the one before it); its interval is at the level of its step, or of the step
	// where the finding stopped, so that it excludes 0 exactly when the verdict is better or worse.
	slices.SortStableFunc(tested, func(a, b int) int { return cmp.Compare(rep.Comparisons[a].est.p, rep.Comparisons[b].est.p) })
	m := len(tested)
	adjusted, stop := 0.0, m
	for k, i := range tested {
		c := &rep.Comparisons[i]
		est := c.est
		adjusted = max(adjusted, min(1, float64(m-k)*est.p))
		p := adjusted
		if p >= Alpha && stop == m {
			stop = k
		}
		share := float64(m - min(k, stop)) // the comparisons the level is shared among at this step
		half := tQuantile(1-Alpha/(2*share), est.df) * est.se
		ci := Interval{sign * (est.diff - half), sign * (est.diff + half)}
		if ci[0] > ci[1] {
			ci[0], ci[1] = ci[1], ci[0]
		}
		c.CI, c.PValue = &ci, &p
		level := fmt.Sprintf("%.1f%%", 100*(1-Alpha/share))
		switch {
		case p < Alpha && est.diff > 0:
			c.Verdict = Better
			c.Reason = fmt.Sprintf("over %d randomized executions (%d teams) version %d's teams did better than version %d's by %.2f, %s interval %s (p = %.3g, Holm-corrected over %d comparison(s))",
				c.Executions, c.Teams, c.Version, c.Baseline, math.Abs(est.diff), level, ci, p, len(tested))
		case p < Alpha:
			c.Verdict = Worse
			c.Reason = fmt.Sprintf("over %d randomized executions (%d teams) version %d's teams did worse than version %d's by %.2f, %s interval %s (p = %.3g, Holm-corrected over %d comparison(s))",
				c.Executions, c.Teams, c.Version, c.Baseline, math.Abs(est.diff), level, ci, p, len(tested))
		case opt.Margin > 0 && -opt.Margin < ci[0] && ci[1] < opt.Margin:
			c.Verdict = NoDifference
			c.Reason = fmt.Sprintf("over %d randomized executions (%d teams) the %s interval of the difference %s lies within the margin of ±%.4g (p = %.3g, Holm-corrected over %d comparison(s)): any difference is smaller than the margin",
				c.Executions, c.Teams, level, ci, opt.Margin, p, len(tested))
		default:
			c.Verdict = Inconclusive
			reach := math.Max(math.Abs(ci[0]), math.Abs(ci[1]))
			beyond := "and no margin was given (--margin: the largest difference you would call none)"
			if opt.Margin > 0 {
				beyond = fmt.Sprintf("beyond the margin of ±%.4g", opt.Margin)
			}
			c.Reason = fmt.Sprintf("over %d randomized executions (%d teams) the %s interval of the difference %s holds 0 and differences up to %.2f, %s (p = %.3g, Holm-corrected over %d comparison(s)): no difference shown, and none ruled out",
				c.Executions, c.Teams, level, ci, reach, beyond, p, len(tested))
		}
		c.scope(share, sign, opt.Margin)
		c.interim(ends, planned)
		c.Reason += c.attrition
	}
	failuresSaid(rep.Comparisons)
	return rep
}

// interim holds a better, worse or no difference verdict back while an execution it stands on is
// not finished: one whose requests said max_rounds and none of whose teams was served that round
// yet. Executions whose requests said none are taken as finished, and the reason says so.
func (c *Comparison) interim(ends, planned map[string]int) {
	if c.Verdict != Better && c.Verdict != Worse && c.Verdict != NoDifference {
		return
	}
	var running, unknown []string
	for _, e := range c.ByExecution {
		switch p := planned[e.Execution]; {
		case p == 0:
			unknown = append(unknown, e.Execution)
		case ends[e.Execution] < p:
			running = append(running, fmt.Sprintf("%s at round %d of %d", e.Execution, ends[e.Execution], p))
		}
	}
	if len(running) > 0 {
		c.Reason = fmt.Sprintf("not finished: %s; as they stand: %s: %s (a verdict read after every round would be wrong more often than its level at one look or another: it waits for the end)",
			strings.Join(running, ", "), c.Verdict, c.Reason)
		c.Verdict, c.Scope = Interim, ""
		return
	}
	if len(unknown) > 0 {
		c.Reason += fmt.Sprintf("; the requests of %s said no max_rounds, so compare cannot tell whether they are finished: read it once they are", strings.Join(unknown, ", "))
	}
}

// scope says what a better, worse or no difference verdict covers: the same finding from the
// random-effect test over executions (at the level of the comparison's step, in the verdict's
// direction; for no difference, its interval within the margin) holds for executions like these;
// otherwise, or below MinExecutions, for these executions only.
func (c *Comparison) scope(share, sign, margin float64) {
	if c.Verdict != Better && c.Verdict != Worse && c.Verdict != NoDifference {
		return
	}
	c.Scope = ScopeThese
	why := fmt.Sprintf("%d randomized execution(s): at least %d are needed to say how much the effect varies between executions", c.Executions, MinExecutions)
	if re := c.re; re != nil {
		half := tQuantile(1-Alpha/(2*share), re.df) * re.se
		lo, hi := sign*(re.diff-half), sign*(re.diff+half)
		if lo > hi {
			lo, hi = hi, lo
		}
		holds := false
		switch c.Verdict {
		case Better:
			holds = re.diff-half > 0
		case Worse:
			holds = re.diff+half < 0
		case NoDifference:
			holds = -margin < lo && hi < margin
		}
		if holds {
			c.Scope = ScopeBeyond
		}
		why = fmt.Sprintf("counting how much the effect varies between executions, the interval is %s", Interval{lo, hi})
	}
	c.Reason += fmt.Sprintf("; holds for %s (%s)", c.Scope, why)
}

// failuresSaid adds the failures to every comparison's reason and, where a version's requests
// failed clearly more often than the baseline's (each test at Alpha over the comparisons with one:
// Bonferroni), makes its verdict "fails more", the score's verdict kept in the reason.
func failuresSaid(comparisons []Comparison) {
	m := 0
	for _, c := range comparisons {
		if c.Failures != nil && c.Failures.PValue != nil {
			m++
		}
	}
	for i := range comparisons {
		c := &comparisons[i]
		f := c.Failures
		if f == nil {
			continue
		}
		rates := fmt.Sprintf("%.1f%% of version %d's requests failed, %.1f%% of version %d's", 100*f.Rate, c.Version, 100*f.BaselineRate, c.Baseline)
		switch {
		case c.Verdict == Interim:
			c.Reason += "; as they stand, " + rates // failing more, like the scores' verdict, waits for the end
		case f.PValue != nil && *f.PValue < Alpha/float64(m) && f.Difference > 0:
			c.Reason = fmt.Sprintf("version %d's requests failed more often than version %d's: %s (p = %.3g, Bonferroni over %d): a failed request got no prompt; as for the scores: %s: %s",
				c.Version, c.Baseline, rates, *f.PValue, m, c.Verdict, c.Reason)
			c.ScoresVerdict, c.Verdict = c.Verdict, FailsMore
		case f.PValue != nil && *f.PValue < Alpha/float64(m):
			c.Reason += fmt.Sprintf("; version %d's requests failed less often: %s (p = %.3g)", c.Version, rates, *f.PValue)
		default:
			c.Reason += "; " + rates
		}
	}
}

// blocked is a blocked estimate: the difference (in the better direction), its standard error,
// degrees of freedom and two-sided p-value.
type blocked struct {
	diff, se, df, p float64
}

// compare is the test of v against base: the blocked estimate over the executions that randomized
// teams between the two, or the verdict that refuses one (NotRandomized, NotEnoughData). Verdict
// is empty when the test is to be made (Analyze corrects it for multiplicity).
func compare(teams []*team, v, base int, ends map[string]int) Comparison {
	c := Comparison{Version: v, Baseline: base}
	// members are the teams of each block with an outcome, unscored those with none (served, and
	// never evaluated): they count as teams that left, and in the failures.
	members, unscored := map[blockKey][]member{}, map[blockKey][]member{}
	var keys, all []blockKey       // blocks with teams evaluated; blocks with any team
	arms := map[blockKey]*[2]int{} // teams of each arm, evaluated or not
	for _, t := range teams {
		version, label, ok := t.assigned()
		if !ok || version != v && version != base {
			continue
		}
		k := blockKey{t.exec, label, t.split}
		arm := 0
		if version == base {
			arm = 1
		}
		if arms[k] == nil {
			arms[k] = &[2]int{}
			all = append(all, k)
		}
		arms[k][arm]++
		if len(t.rel) == 0 {
			unscored[k] = append(unscored[k], member{arm, t})
			continue
		}
		if members[k] == nil {
			keys = append(keys, k)
		}
		members[k] = append(members[k], member{arm, t})
	}
	// The blocks that randomized teams between the two, evaluated or not: where failures and
	// attrition are compared (a version whose every team only failed was randomized all the
	// same; its failures are the difference).
	var randomized []blockKey
	for _, k := range all {
		if arms[k][0] > 0 && arms[k][1] > 0 {
			randomized = append(randomized, k)
		}
	}
	// A team's outcome is its mean, over the rounds it was served its version, of its score less
	// its execution-round's mean (so that how long it stayed does not matter), adjusted for the
	// same mean before it was assigned where every team of the block has rounds before (teams
	// with and without are not measured alike: a block of both is read unadjusted). The
	// adjustment is CUPED's: y - theta*(x - the block's mean x), theta the slope of outcomes on
	// their before within each version of each block, pooled: where rounds before say little about
	// rounds after, theta is small and the adjustment adds little noise, unlike the plain
	// difference y - x.
	type unit struct {
		arm  int
		y, x float64
	}
	adjusted := map[blockKey]bool{}
	units := map[blockKey][]unit{}
	var sxy, sxx float64
	for _, k := range keys {
		adjust := true
		for _, m := range members[k] {
			adjust = adjust && len(m.t.relPre) > 0
		}
		adjusted[k] = adjust
		var xs, ys [2][]float64 // by arm
		for _, m := range members[k] {
			u := unit{arm: m.arm, y: mean(m.t.rel)}
			if adjust {
				u.x = mean(m.t.relPre)
				xs[m.arm], ys[m.arm] = append(xs[m.arm], u.x), append(ys[m.arm], u.y)
			}
			units[k] = append(units[k], u)
		}
		// The slope within each version of the block: around the block's mean alone, a chance
		// imbalance of befores between the versions would take part of the effect into theta.
		for arm := range xs {
			if len(xs[arm]) > 1 {
				mx, my := mean(xs[arm]), mean(ys[arm])
				for i := range xs[arm] {
					sxy += (xs[arm][i] - mx) * (ys[arm][i] - my)
					sxx += (xs[arm][i] - mx) * (xs[arm][i] - mx)
				}
			}
		}
	}
	theta, thetaFit := 0.0, sxx > 0
	if thetaFit {
		theta = sxy / sxx
	}
	blocks := map[blockKey]*[2][]float64{}
	for _, k := range keys {
		var xs []float64
		for _, u := range units[k] {
			xs = append(xs, u.x)
		}
		mx := mean(xs)
		b := &[2][]float64{}
		for _, u := range units[k] {
			y := u.y
			if adjusted[k] {
				y -= theta * (u.x - mx)
			}
			b[u.arm] = append(b[u.arm], y)
		}
		blocks[k] = b
	}
	var both []blockKey
	n := [2]int{}
	for _, k := range keys {
		b := blocks[k]
		if len(b[0]) > 0 && len(b[1]) > 0 {
			both = append(both, k)
			n[0] += len(b[0])
			n[1] += len(b[1])
		}
	}
	execs := map[string]bool{}
	for _, k := range both {
		execs[k.exec] = true
	}
	c.Executions, c.Teams = len(execs), n[0]+n[1]
	if len(randomized) == 0 {
		c.Verdict = NotRandomized
		c.Reason = fmt.Sprintf("no execution had teams randomized between versions %d and %d by a split label (served in other executions or at other times, by an explicit version, or a team moved between them): the figures describe, they do not compare", v, base)
		return c
	}
	c.Failures = failuresOf(randomized, members, unscored, v, base)
	// Teams that left before their execution's last round, or were never evaluated, by version:
	// said whenever any did, and no verdict when the versions lost them at clearly different
	// rates (an outcome missing more often under one version is a difference in itself, and
	// leaves teams that are no longer comparable).
	var left, stayed, never [2]int
	strata := make([][4]int, 0, len(randomized)) // per block: left and stayed of v, left and stayed of base
	for _, k := range randomized {
		var st [4]int
		for _, m := range members[k] {
			if m.t.lastTime < ends[k.exec] {
				left[m.arm]++
				st[2*m.arm]++
			} else {
				stayed[m.arm]++
				st[2*m.arm+1]++
			}
		}
		for _, m := range unscored[k] {
			never[m.arm]++
			left[m.arm]++
			st[2*m.arm]++
		}
		strata = append(strata, st)
	}
	if left[0]+left[1] > 0 {
		c.attrition = fmt.Sprintf("; teams that left before their execution's last round: %d of %d of version %d, %d of %d of version %d",
			left[0], left[0]+stayed[0], v, left[1], left[1]+stayed[1], base)
		if never[0]+never[1] > 0 {
			c.attrition += fmt.Sprintf(" (never evaluated: %d and %d)", never[0], never[1])
		}
		if p := leftAlike(strata); p < Alpha {
			c.Verdict = AttritionDiffers
			c.Reason = fmt.Sprintf("version %d's teams left before their execution's last round (or were never evaluated) at another rate than version %d's (%d of %d against %d of %d, p = %.3g within blocks): the teams that stayed are not comparable, and which version keeps teams is itself a difference",
				v, base, left[0], left[0]+stayed[0], left[1], left[1]+stayed[1], p)
			return c
		}
	}
	if len(both) == 0 {
		c.Verdict = NotEnoughData
		c.Reason = fmt.Sprintf("no execution that randomized teams between versions %d and %d has evaluated teams of both", v, base) + c.attrition
		return c
	}
	bs := make([]*[2][]float64, 0, len(both))
	for _, k := range both {
		bs = append(bs, blocks[k])
	}
	diff, variance, dof := blockedWelch(bs)
	c.Difference = &diff
	c.ByExecution, c.re = byExecution(both, blocks)
	if n[0] < MinTeams || n[1] < MinTeams {
		c.Verdict = NotEnoughData
		c.Reason = fmt.Sprintf("%d teams of version %d and %d of version %d were randomized between them in the same executions; a verdict needs %d of each", n[0], v, n[1], base, MinTeams) + c.attrition
		return c
	}
	if thetaFit {
		dof = max(dof-1, 0) // theta was estimated from the same outcomes
	}
	if dof < MinDF || variance <= 0 {
		c.Verdict = NotEnoughData
		c.Reason = fmt.Sprintf("the teams' spread within executions stands on %.1f degrees of freedom; a verdict needs %d", dof, MinDF) + c.attrition
		return c
	}
	se := math.Sqrt(variance)
	t := diff / se
	c.est = blocked{diff: diff, se: se, df: dof, p: 2 * distuv.StudentsT{Mu: 0, Sigma: 1, Nu: dof}.Survival(math.Abs(t))}
	return c
}

// blockKey is a block: an execution, a split label under which teams were served the two versions
// compared (each team one version for the whole execution), and the weights that assigned them:
// teams first served under other weights (changed while the execution ran) came at another moment
// with other chances, and are compared only with their own.
type blockKey struct{ exec, label, split string }

// member is a team of a block, with its arm: 0 the version compared, 1 the baseline.
type member struct {
	arm int
	t   *team
}

// Failures is how often two versions' requests failed, among the teams randomized between them.
type Failures struct {
	// Rate and BaselineRate are the shares of requests that failed (prompt.failed), of the version
	// and of the baseline.
	Rate         float64 `json:"rate"`
	BaselineRate float64 `json:"baseline_rate"`
	// Difference is the blocked difference of the teams' shares of failed requests (the
	// version's less the baseline's), PValue its two-sided p-value (as for scores: Welch within
	// executions); nil where the data allow no test.
	Difference float64  `json:"difference"`
	PValue     *float64 `json:"p_value"`
}

// failuresOf compares the shares of failed requests of the teams of the blocks in both, those
// never evaluated included; nil when no request of either failed.
func failuresOf(both []blockKey, members, unscored map[blockKey][]member, v, base int) *Failures {
	var failed, asked, teams [2]int
	bs := make([]*[2][]float64, 0, len(both))
	for _, k := range both {
		b := &[2][]float64{}
		for _, m := range append(slices.Clip(members[k]), unscored[k]...) {
			version := v
			if m.arm == 1 {
				version = base
			}
			f, n := m.t.failed[version], m.t.failed[version]+m.t.prompts[version]
			if n == 0 {
				continue
			}
			failed[m.arm] += f
			asked[m.arm] += n
			b[m.arm] = append(b[m.arm], float64(f)/float64(n))
		}
		if len(b[0]) > 0 && len(b[1]) > 0 {
			bs = append(bs, b)
			teams[0], teams[1] = teams[0]+len(b[0]), teams[1]+len(b[1])
		}
	}
	if failed[0]+failed[1] == 0 || asked[0] == 0 || asked[1] == 0 {
		return nil
	}
	out := &Failures{Rate: float64(failed[0]) / float64(asked[0]), BaselineRate: float64(failed[1]) / float64(asked[1])}
	diff, variance, dof := blockedWelch(bs)
	out.Difference = diff
	switch {
	case variance > 0 && dof >= MinDF:
		p := 2 * distuv.StudentsT{Mu: 0, Sigma: 1, Nu: dof}.Survival(math.Abs(diff)/math.Sqrt(variance))
		out.PValue = &p
	case variance == 0 && diff != 0 && teams[0] >= MinTeams && teams[1] >= MinTeams:
		// Within each block every team of a version failed alike (all of one version's
		// requests, none of the other's): the difference is no estimate but a count.
		p := 0.0
		out.PValue = &p
	}
	return out
}

// byExecution is each execution's own difference (over its blocks), in execution order, and the
// random-effect test over them: DerSimonian and Laird's estimate of how much the effect varies
// between executions, the mean weighted by 1/(v + tau^2), its variance as Hartung and Knapp
// correct it (never below the plain one) on G-1 degrees of freedom, which holds its level with few
// executions where the plain one does not. Nil below MinExecutions, or where an execution's own
// variance cannot be had (one team of a version in it and no other to pool with).
func byExecution(both []blockKey, blocks map[blockKey]*[2][]float64) ([]ExecutionDifference, *blocked) {
	byExec := map[string][]*[2][]float64{}
	for _, k := range both {
		byExec[k.exec] = append(byExec[k.exec], blocks[k])
	}
	execs := slices.Sorted(maps.Keys(byExec))
	out := make([]ExecutionDifference, 0, len(execs))
	ds, vs := make([]float64, 0, len(execs)), make([]float64, 0, len(execs))
	for _, e := range execs {
		d, v, _ := blockedWelch(byExec[e])
		teams := 0
		for _, b := range byExec[e] {
			teams += len(b[0]) + len(b[1])
		}
		out = append(out, ExecutionDifference{Execution: e, Difference: d, Teams: teams})
		ds, vs = append(ds, d), append(vs, v)
	}
	g := len(ds)
	if g < MinExecutions || slices.ContainsFunc(vs, func(v float64) bool { return !(v > 0) }) {
		return out, nil
	}
	var sw, sw2, swd float64
	for i := range ds {
		w := 1 / vs[i]
		sw, sw2, swd = sw+w, sw2+w*w, swd+w*ds[i]
	}
	mean := swd / sw
	q := 0.0
	for i := range ds {
		q += (ds[i] - mean) * (ds[i] - mean) / vs[i]
	}
	tau2 := max(0, (q-float64(g-1))/(sw-sw2/sw))
	var sws, swsd float64
	for i := range ds {
		w := 1 / (vs[i] + tau2)
		sws, swsd = sws+w, swsd+w*ds[i]
	}
	mu := swsd / sws
	qs := 0.0
	for i := range ds {
		qs += (ds[i] - mu) * (ds[i] - mu) / (vs[i] + tau2)
	}
	se := math.Sqrt(max(1, qs/float64(g-1)) / sws)
	dof := float64(g - 1)
	return out, &blocked{diff: mu, se: se, df: dof, p: 2 * distuv.StudentsT{Mu: 0, Sigma: 1, Nu: dof}.Survival(math.Abs(mu)/se)}
}

// blockedWelch is the blocked difference of two arms' means (arm 0 less arm 1) over blocks that
// hold both: each block's difference of arm means, weighted by its precision n_0*n_1/(n_0+n_1);
// its variance from each arm's spread within blocks (unequal spreads allowed), degrees of freedom
// by Welch-Satterthwaite; where one arm has one unit per block, one spread pooled for both. A
// variance of 0 where the data give none.
func blockedWelch(blocks []*[2][]float64) (diff, variance, dof float64) {
	var wsum, dsum float64
	var ss [2]float64
	var df [2]int
	var coef [2]float64 // sum of w^2/n per arm
	for _, b := range blocks {
		na, nb := float64(len(b[0])), float64(len(b[1]))
		w := na * nb / (na + nb)
		ma, mb := mean(b[0]), mean(b[1])
		wsum += w
		dsum += w * (ma - mb)
		for i, m := range []float64{ma, mb} {
			for _, y := range b[i] {
				ss[i] += (y - m) * (y - m)
			}
			df[i] += len(b[i]) - 1
			coef[i] += w * w / float64(len(b[i]))
		}
	}
	if wsum == 0 {
		return 0, 0, 0
	}
	diff = dsum / wsum
	var a [2]float64
	switch {
	case df[0] >= 1 && df[1] >= 1:
		for i := range a {
			a[i] = coef[i] * ss[i] / float64(df[i]) / (wsum * wsum)
		}
		if a[0]+a[1] > 0 {
			dof = (a[0] + a[1]) * (a[0] + a[1]) / (a[0]*a[0]/float64(df[0]) + a[1]*a[1]/float64(df[1]))
		}
	case df[0]+df[1] >= 1:
		pooled := (ss[0] + ss[1]) / float64(df[0]+df[1])
		for i := range a {
			a[i] = coef[i] * pooled / (wsum * wsum)
		}
		dof = float64(df[0] + df[1])
	}
	return diff, a[0] + a[1], dof
}

// clusteredInterval is the 95% interval of the mean m of n team outcomes, by execution: teams of
// one execution share its task and its level, so the spread that counts is that of the executions'
// sums (the cluster-robust variance with its small-sample factor G/(G-1), Student's t at G-1
// degrees of freedom). Nil below two executions: one execution says nothing of another's level.
func clusteredInterval(byExec map[string][]float64, m float64, n int) *Interval {
	g := len(byExec)
	if g < 2 {
		return nil
	}
	ss := 0.0
	for _, e := range slices.Sorted(maps.Keys(byExec)) { // in order: the same figures, bit for bit
		sum := 0.0
		for _, y := range byExec[e] {
			sum += y - m
		}
		ss += sum * sum
	}
	se := math.Sqrt(float64(g)/float64(g-1)*ss) / float64(n)
	half := tQuantile(0.975, float64(g-1)) * se
	return &Interval{m - half, m + half}
}

// leftAlike is the two-sided p-value of the test that the versions lost teams at the same rate,
// within blocks (each [left of v, stayed of v, left of base, stayed of base]): blocks may differ
// in when their teams came and with what weights, so a rate that differs only between blocks is
// not a difference between versions. One block: Fisher's exact test; several: Cochran, Mantel
// and Haenszel's, with the continuity correction, on one degree of freedom. 1 when no block says
// anything (every team left, or none).
func leftAlike(strata [][4]int) float64 {
	var informative [][4]int
	for _, st := range strata {
		if l, s := st[0]+st[2], st[1]+st[3]; l > 0 && s > 0 && st[0]+st[1] > 0 && st[2]+st[3] > 0 {
			informative = append(informative, st)
		}
	}
	switch len(informative) {
	case 0:
		return 1
	case 1:
		st := informative[0]
		return fisher(st[0], st[1], st[2], st[3])
	}
	var dev, variance float64
	for _, st := range informative {
		a, b, c, d := float64(st[0]), float64(st[1]), float64(st[2]), float64(st[3])
		n := a + b + c + d
		row, col := a+b, a+c
		dev += a - row*col/n
		variance += row * (c + d) * col * (b + d) / (n * n * (n - 1))
	}
	if variance <= 0 {
		return 1
	}
	x := math.Max(math.Abs(dev)-0.5, 0)
	return distuv.ChiSquared{K: 1}.Survival(x * x / variance)
}

// fisher is the two-sided p-value of Fisher's exact test of the 2x2 table [[a, b], [c, d]]: the
// probability, with the margins fixed, of a table as unlikely as this one or less (each from the
// hypergeometric distribution, summed over every table at most as likely).
func fisher(a, b, c, d int) float64 {
	n, row, col := a+b+c+d, a+b, a+c
	logP := func(x int) float64 { return lchoose(row, x) + lchoose(n-row, col-x) - lchoose(n, col) }
	seen, p := logP(a), 0.0
	for x := max(0, col-(n-row)); x <= min(row, col); x++ {
		if l := logP(x); l <= seen+1e-9 {
			p += math.Exp(l)
		}
	}
	return min(p, 1)
}

// lchoose is the logarithm of n choose k.
func lchoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// tQuantile is Student's t's q-quantile at df degrees of freedom.
func tQuantile(q, df float64) float64 {
	return distuv.StudentsT{Mu: 0, Sigma: 1, Nu: df}.Quantile(q)
}
