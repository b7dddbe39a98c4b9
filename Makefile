# podium: the README's two commands are `make demo` and `make test`.
GO      ?= go
BIN     ?= bin
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PKGS    := ./...

.PHONY: all build builders test test-long test-short lint demo bench fuzz soak clickhouse clickhouse-server clean help

all: build

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build archiver, composer, console, demo, podium and ranker into bin/
	$(GO) build -buildvcs=auto -o $(BIN)/ ./cmd/...

builders: ## build the example prompt builders into bin/: Go as a reactor and as a command (GOOS=wasip1), C (Debian's clang and wasi-libc) and Rust (Debian's rustc): make clickhouse installs them
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 $(GO) build -buildmode=c-shared -o $(BIN)/phi4mini.wasm ./builders/phi4mini
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 $(GO) build -o $(BIN)/phi4mini-command.wasm ./builders/phi4mini
	builders/phi4mini-c/build.sh $(BIN)/phi4mini-c.wasm
	builders/phi4mini-rs/build.sh $(BIN)/phi4mini-rs.wasm

clickhouse-server: ## install the ClickHouse server when missing (Debian), all the demo needs besides Go
	@command -v clickhouse-server >/dev/null 2>&1 || command -v clickhouse >/dev/null 2>&1 || { \
		echo "installing Debian's clickhouse-server clickhouse-client"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq clickhouse-server clickhouse-client; }

clickhouse: clickhouse-server ## install what the tests run for real when missing: ClickHouse, ZooKeeper, Jinja2, Chromium, Node, clang with wasi-libc, rustc with its wasm32 library (Debian); ajv, nats.js and chDB (npm, locked)
	@missing=""; \
	[ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1 || missing="$$missing zookeeper"; \
	/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1 || missing="$$missing python3-jinja2"; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	{ command -v clang >/dev/null 2>&1 && command -v wasm-ld >/dev/null 2>&1 && [ -d /usr/include/wasm32-wasi ] && \
	  ls /usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1; } || missing="$$missing clang lld wasi-libc libclang-rt-14-dev-wasm32"; \
	{ [ -x /usr/bin/rustc ] && [ -d /usr/lib/rustlib/wasm32-wasi ]; } || missing="$$missing rustc libstd-rust-dev-wasm32"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian's$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@# ajv for the differential test of the schemas, and the JavaScript orchestrator example's packages, from their lockfiles
	@[ -d schemas/conformance/node_modules/ajv ] || npm ci --prefix schemas/conformance --no-audit --no-fund --loglevel=error
	@[ -d examples/orchestrator-js/node_modules/@nats-io ] || npm ci --prefix examples/orchestrator-js --no-audit --no-fund --loglevel=error
	@# chDB, a current ClickHouse engine, which the store's queries are compared on. Its lockfile holds
	@# the native library of this platform only, which npm ci refuses; npm install --no-save keeps to it.
	@[ -d internal/chstore/chdb/node_modules/chdb ] || npm install --prefix internal/chstore/chdb --no-save --no-audit --no-fund --loglevel=error

demo: clickhouse-server build ## play a 4-team, 3-round tournament on real JetStream and ClickHouse, with the web console (SERVE=1 keeps it up until Ctrl-C)
	$(BIN)/demo --bin $(BIN) $(if $(SERVE),--serve)

test: clickhouse ## run every test (unit, store, end-to-end) against real servers
	$(GO) test -count=1 -timeout 25m $(PKGS)

test-long: clickhouse ## the tests that wait out real windows (PODIUM_LONG=1: a request replayed after PROMPTS' shipped 10-minute duplicate window)
	PODIUM_LONG=1 $(GO) test -count=1 -run '^TestReplayAfterShippedWindow$$' -timeout 20m -v ./e2e

SOAK ?= 30m
soak: clickhouse ## the chaos soak for SOAK (default 30m; make test plays 100s of it: one cycle of every fault); SEED=N plays that schedule again
	PODIUM_SOAK=$(SOAK) $(if $(SEED),PODIUM_SOAK_SEED=$(SEED)) $(GO) test -count=1 -run '^TestChaosSoak$$' -timeout 0 -v ./e2e

test-short: ## unit tests that need no server
	$(GO) test -count=1 -short $(PKGS)

lint: ## go vet and staticcheck
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

bench: clickhouse build ## benchmarks with their baselines (figures and how to read them: README)
	$(GO) test -run '^$$' -bench 'Parse|Render' -benchmem -count=1 ./pkg/events ./pkg/compose
	$(GO) test -run '^$$' -bench 'CountCold|CountLongRun' -count=1 ./pkg/bpe
	$(GO) test -run '^$$' -bench LeaderboardRead -benchtime 2000x -count=1 -timeout 20m ./internal/chstore
	$(GO) test -run '^$$' -bench RankerIngest -benchtime 50000x -count=1 -timeout 20m ./e2e
	$(GO) test -run '^$$' -bench ComposerPipeline -benchtime 1x -count=1 -timeout 20m -v ./e2e
	$(GO) test -run '^$$' -bench ArchiveCapacity -benchtime 1x -count=1 -timeout 20m ./e2e -args -capacity.executions=20
	$(GO) test -run '^$$' -bench RunExampleBuilder -benchmem -count=1 ./internal/wasm
	$(GO) test -run '^$$' -bench BuilderVersusTemplate -benchtime 1x -count=1 -timeout 20m ./e2e

FUZZTIME ?= 30s
FUZZ    := pkg/events:FuzzParseEvaluation pkg/events:FuzzParseRoundRequest pkg/events:FuzzParseRenderRequest \
           pkg/events:FuzzParseTeamSubject pkg/compose:FuzzLoad pkg/compose:FuzzRender pkg/bpe:FuzzCount pkg/bpe:FuzzPretokenize \
           pkg/builder:FuzzDecodeBuilt internal/wasm:FuzzBound internal/wasm:FuzzKindOf internal/wasm:FuzzInterruptible

fuzz: ## run every fuzz target for FUZZTIME (default 30s) each; failures are saved in testdata/fuzz
	@set -e; for t in $(FUZZ); do \
		pkg=$${t%%:*}; name=$${t##*:}; echo "== $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) ./$$pkg; \
	done

clean: ## remove build output
	rm -rf $(BIN)
