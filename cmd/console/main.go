// Command console serves the read-only web console of Podium: executions, leaderboards over
// rounds, each team's prompts and diffs, templates and dead letters, live. It reads the same
// NATS and ClickHouse as the services, configured by the same environment.
package main

import (
	"github.com/podium-llm/podium/internal/process"
	"github.com/podium-llm/podium/internal/service"
	_ "time/tzdata" // request timezones must resolve the same on every machine
)

func main() { process.Main("console", service.Main(command, run), nil) }
