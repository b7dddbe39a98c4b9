package experiment

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// tournament is seeded executions of teams over rounds, half of each execution's teams served
// version 1 and half version 2; each round a team's score moves by 2 plus noise, plus effect when
// the prompt of that round was version 2's.
func tournament(seed uint64, effect float64) ([]Served, map[string][]rank.RoundScore) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var served []Served
	rounds := map[string][]rank.RoundScore{}
	for x := range 3 {
		exec := fmt.Sprintf("e%d", x)
		for k := range 8 {
			team, version := fmt.Sprintf("t%d", k), 1+k%2
			score := 50 + 10*rng.Float64()
			for r := 1; r <= 6; r++ {
				if r > 1 {
					score += 2 + 2*rng.NormFloat64()
					if version == 2 {
						score += effect
					}
				}
				served = append(served, Served{ExecutionID: exec, TeamID: team, Round: r, Version: version})
				rounds[exec] = append(rounds[exec], rank.RoundScore{TeamID: team, Round: r, Score: score})
			}
		}
	}
	return served, rounds
}

func TestCompareFindsAKnownEffect(t *testing.T) {
	served, rounds := tournament(7, 3)
	got := Compare(Observe(served, rounds, events.Desc), 42)
	if len(got) != 2 || got[0].Version != 1 || got[1].Version != 2 {
		t.Fatalf("versions: %+v", got)
	}
	for _, v := range got {
		if v.Prompts != 72 || v.Teams != 12 || v.Executions != 3 || v.GainPrompts != 60 {
			t.Errorf("version %d counts: %+v", v.Version, v)
		}
		if v.MeanGainCI[0] > v.MeanGain || v.MeanGainCI[1] < v.MeanGain {
			t.Errorf("version %d: the mean gain %v is outside its interval %v", v.Version, v.MeanGain, v.MeanGainCI)
		}
	}
	d := got[1].VersusPrevious[0]
	t.Logf("v1 gain %.2f %v, v2 gain %.2f %v, v2-v1 %.2f %v", got[0].MeanGain, got[0].MeanGainCI, got[1].MeanGain, got[1].MeanGainCI, d.MeanGainDiff, d.CI)
	if d.Version != 1 || d.CI[0] <= 0 || d.MeanGainDiff < 2 || d.MeanGainDiff > 4 {
		t.Errorf("the effect of 3 was not found: %+v", d)
	}
	// Seeded: the same data and seed give the same figures.
	if again := Compare(Observe(served, rounds, events.Desc), 42); !reflect.DeepEqual(again, got) {
		t.Error("the same seed gave other figures")
	}
}

// TestCompareFindsNoDifferenceInAnAASplit: over many seeded A/A tournaments (both versions alike),
// the 95% interval of the difference holds 0 about 95 times in 100: a difference is "found" about
// as often as chance allows, no more.
func TestCompareFindsNoDifferenceInAnAASplit(t *testing.T) {
	const runs = 200
	found := 0
	for seed := range uint64(runs) {
		served, rounds := tournament(1000+seed, 0)
		d := Compare(Observe(served, rounds, events.Desc), seed)[1].VersusPrevious[0]
		if d.CI[0] > 0 || d.CI[1] < 0 {
			found++
		}
	}
	t.Logf("%d of %d A/A splits found a difference at 95%%", found, runs)
	if found > runs*8/100 {
		t.Errorf("%d of %d A/A splits found a difference: the intervals are too narrow", found, runs)
	}
}

// TestObserveGain: the gain is over the team's best before the round, in the execution's order;
// a round no evaluation answered is left out.
func TestObserveGain(t *testing.T) {
	rounds := map[string][]rank.RoundScore{"e": {{TeamID: "t", Round: 1, Score: 60}, {TeamID: "t", Round: 2, Score: 50}, {TeamID: "t", Round: 3, Score: 70}}}
	served := []Served{{"e", "t", 1, 1}, {"e", "t", 2, 1}, {"e", "t", 3, 1}, {"e", "t", 4, 1}}
	got := Observe(served, rounds, events.Desc)
	want := []Observation{{Served: served[0], Score: 60}, {Served: served[1], Score: 50, Gain: -10, HasGain: true}, {Served: served[2], Score: 70, Gain: 10, HasGain: true}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("desc: %+v", got)
	}
	if got := Observe(served, rounds, events.Asc); got[1].Gain != 10 || got[2].Gain != -20 {
		t.Errorf("asc: %+v", got)
	}
}
