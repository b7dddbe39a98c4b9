// Command demo plays a small tournament on the real pipeline: it starts a private ClickHouse and
// an in-process JetStream server, runs the ranker and composer binaries, acts as the orchestrator
// (4 teams x 3 rounds with synthetic submissions and scores), prints the head of every composed
// prompt and the final leaderboard, and stops everything it started.
package main

import (
	"github.com/podium-llm/podium/internal/process"
)

func main() { process.Main("demo", run, nil) }
