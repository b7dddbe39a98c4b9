// Command ranker consumes evaluation.completed from JetStream, stores every evaluation in
// ClickHouse exactly once per event id, announces leaderboard.updated after each commit and serves
// leaderboards and team histories over HTTP.
package main

import (
	"github.com/podium-llm/podium/internal/process"
	"github.com/podium-llm/podium/internal/ranker"
	"github.com/podium-llm/podium/internal/service"
)

func main() { process.Main("ranker", service.Main(ranker.Command, ranker.Run), nil) }
