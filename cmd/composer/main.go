// Command composer answers every round.requested with a prompt.composed (or a prompt.failed): it
// waits until the ranker has committed every evaluation acknowledged before the request, reads the
// team's history and the leaderboard from ClickHouse, renders the template and publishes the
// prompt to the PROMPTS audit stream. Replicas share the work through one durable consumer.
package main

import (
	"github.com/podium-llm/podium/internal/composer"
	"github.com/podium-llm/podium/internal/process"
	"github.com/podium-llm/podium/internal/service"
	_ "time/tzdata" // request timezones must resolve the same on every machine
)

func main() { process.Main("composer", service.Main(composer.Command, composer.Run), nil) }
