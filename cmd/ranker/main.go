// Command ranker consumes evaluation.completed from JetStream, stores every evaluation in
// ClickHouse exactly once per event id, announces leaderboard.updated after each commit and serves
// leaderboards and team histories over HTTP.
package main

import (
	"github.com/podium-llm/podium/internal/process"
	"github.com/podium-llm/podium/internal/ranker"
)

func main() { process.Main("ranker", ranker.Main, nil) }
