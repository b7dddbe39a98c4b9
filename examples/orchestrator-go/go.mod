module github.com/podium-llm/podium/examples/orchestrator-go

go 1.26.0

require (
	github.com/nats-io/nats.go v1.55.0
	github.com/podium-llm/podium v0.0.0
)

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// The module path is not published: build against this repository.
replace github.com/podium-llm/podium => ../..
