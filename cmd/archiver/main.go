// Command archiver copies every record of the PROMPTS audit stream into the prompts table of
// ClickHouse, once per event id, so the audit outlives the stream's retention at a fraction of
// its size (docs/operating.md, "The prompts archive").
package main

import (
	"github.com/podium-llm/podium/internal/archiver"
	"github.com/podium-llm/podium/internal/process"
	"github.com/podium-llm/podium/internal/service"
)

func main() { process.Main("archiver", service.Main(archiver.Command, archiver.Run), nil) }
