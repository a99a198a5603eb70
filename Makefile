# Molly — build, run and test. Every target installs what it needs on a fresh
# Debian machine that has Go: Go modules come from the module proxy; the
# llama.cpp sources come with the github.com/ollama/ollama module.
SHELL := /bin/bash
GO ?= go
BIN := bin/molly
export GOFLAGS ?= -buildvcs=false

# cgo flags for llama.cpp/ggml (docs/architecture.md). The include folders live in
# the module cache; `go mod download -json` fetches the module if needed and
# prints where it is. Override CGO_CFLAGS/CGO_CXXFLAGS for portable builds.
OLLAMA_DIR = $(shell $(GO) mod download -json github.com/ollama/ollama | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$$/\1/p')
export CGO_ENABLED := 1
export CGO_CPPFLAGS = -I$(OLLAMA_DIR)/llama/llama.cpp/include -I$(OLLAMA_DIR)/ml/backend/ggml/ggml/include
# -march=native turns on AMX on Sapphire Rapids and later, but the Go build of
# ggml does not compile its AMX backend (ggml-cpu/amx has no Go file), so the
# link would fail with an undefined ggml_backend_amx_buffer_type.
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
export CGO_CFLAGS ?= -O3 -march=native $(NO_AMX)
export CGO_CXXFLAGS ?= -O3 -march=native $(NO_AMX)

# Test-time limits: the whole suite stays well under CI's budget.
TEST_TIMEOUT ?= 25m

DEMO_MODEL := models/demo/molly-demo.gguf

.PHONY: all build run test bench fuzz soak lint model deps postgres browser clean env sdk
.PHONY: bench-engine

all: build

deps:
	@command -v gcc >/dev/null && command -v g++ >/dev/null || { \
		echo "installing gcc/g++ for cgo (llama.cpp)"; \
		apt-get update -qq && apt-get install -y -qq gcc g++ >/dev/null; }
	$(GO) mod download

# PostgreSQL's programs for the registry's PostgreSQL tests (internal/pgtest
# starts a throwaway cluster per test binary); without them those tests skip
# and say so. Installing needs root; elsewhere, or when apt-get cannot
# install it, this only tells. Only `make test` needs it (not `make run`).
postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then echo "installing postgresql for the registry's PostgreSQL tests"; \
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || \
			echo "postgresql could not be installed: the registry's PostgreSQL tests will skip"; \
		else echo "postgresql is not installed: the registry's PostgreSQL tests will skip (apt-get install postgresql)"; fi; }

# Molly's version, printed by `molly version` with Caddy's.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

build: deps
	@test -x $(BIN) || echo "building $(BIN): the first build compiles llama.cpp (about 10 CPU-minutes), later ones are cached"
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/molly
	$(GO) build -o bin/molly-payments ./plugins/payments
	$(GO) build -o bin/molly-billing ./plugins/billing
	$(GO) build -o bin/molly-support ./plugins/support

# The demo base model and LoRA adapters, generated deterministically (no
# model can be downloaded): ~13 MB GGUF plus four adapters, with a progress
# bar on a terminal (JSON progress lines otherwise).
model: $(DEMO_MODEL)

$(DEMO_MODEL): | build
	./$(BIN) model demo --out models/demo --seed 1 --size small

run: build model
	./$(BIN) run --config Caddyfile

# Anthropic's TypeScript SDK for the Messages API end-to-end test
# (cmd/molly/translate_e2e_test.go), installed from npm when npm is there;
# without it that test skips, saying so. Nothing is vendored.
SDK_DIR := cmd/molly/testdata/node
ANTHROPIC_SDK_VERSION := 1.14.0
sdk:
	@if [ -d $(SDK_DIR)/node_modules/@anthropic-ai/sdk ]; then :; \
	elif command -v npm >/dev/null; then \
		npm install --prefix $(SDK_DIR) --no-audit --no-fund --no-save --silent @anthropic-ai/sdk@$(ANTHROPIC_SDK_VERSION) || \
		echo "npm could not install @anthropic-ai/sdk: the Anthropic SDK test skips"; \
	else echo "npm not found: the Anthropic SDK test skips"; fi

# Headless Chromium (Debian's package) for the console's browser test; when
# apt-get cannot install it, that test skips and says why.
browser:
	@command -v chromium >/dev/null || { echo "installing chromium for the console's browser test"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium could not be installed: TestConsoleInABrowser will skip"; }

test: deps postgres sdk browser
	$(GO) vet ./...
	$(GO) test -timeout $(TEST_TIMEOUT) ./...

# Every package's benchmarks, then the gateway table (docs/benchmarks.md):
# Molly against bare Caddy reverse_proxy in the same run, written to
# bench/latest.txt and compared with the previous run's file.
bench: deps
	$(GO) test -run '^$$' -bench . -skip '^BenchmarkGateway(Load)?$$' -benchtime 2s -timeout 30m ./...
	$(GO) test -run '^$$' -bench '^BenchmarkGateway$$' -benchtime 1x -timeout 30m ./cmd/molly/

# Long fuzzing: FUZZTIME per target (default 5m). The canary residency fuzz
# plants canaries anywhere in valid bodies under every strategy; the others
# fuzz body parsing (against the gjson passes it replaced), redaction and
# the SSE decoder.
FUZZTIME ?= 5m
fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzCanaryResidency$$' -fuzztime $(FUZZTIME) ./router/pipeline/
	$(GO) test -run '^$$' -fuzz '^FuzzScan$$' -fuzztime $(FUZZTIME) ./redaction/
	$(GO) test -run '^$$' -fuzz '^FuzzStreamRestorer$$' -fuzztime $(FUZZTIME) ./redaction/
	$(GO) test -run '^$$' -fuzz '^FuzzEstimate$$' -fuzztime $(FUZZTIME) ./router/capability/
	$(GO) test -run '^$$' -fuzz '^FuzzStreamNormalise$$' -fuzztime $(FUZZTIME) ./router/relay/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./router/openai/
	$(GO) test -run '^$$' -fuzz '^FuzzWalk$$' -fuzztime $(FUZZTIME) ./router/classify/

# Soak: the real gateway (auth, registry, billing outbox, policy, routing)
# at 80% of its measured maximum throughput for SOAK (default 10m), RSS and
# goroutines sampled every 10 s and required to stay flat (cmd/molly TestSoak).
SOAK ?= 10m
soak: deps
	MOLLY_SOAK=$(SOAK) $(GO) test -run '^TestSoak$$' -v -timeout 60m ./cmd/molly/

# The T0 engine against llama.cpp on the same GGUF (prints the table), the
# 64-adapter hot-budget run, adapter promotion, weight/KV quantization and
# aLoRA prefix reuse; part of `make bench` too.
bench-engine: deps
	$(GO) test -run '^$$' -bench 'VersusLlamaCpp|HotBudget|AdapterPromotion|Quantization|ALoRAPrefixReuse|Speculative' -benchtime 1x -timeout 30m ./serving/

lint: deps
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

# Prints the cgo settings, for running go commands by hand: eval "$$(make -s env)"
env:
	@echo export CGO_ENABLED=1
	@echo export CGO_CPPFLAGS=\"$(CGO_CPPFLAGS)\"
	@echo export CGO_CFLAGS=\"$(CGO_CFLAGS)\"
	@echo export CGO_CXXFLAGS=\"$(CGO_CXXFLAGS)\"

clean:
	rm -rf bin models $(SDK_DIR)
