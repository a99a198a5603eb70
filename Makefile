# Molly — build, run and test. Every target installs what it needs on a fresh
# Debian machine that has Go: Go modules come from the module proxy; the
# llama.cpp sources come with the github.com/ollama/ollama module.
SHELL := /bin/bash
GO ?= go
BIN := bin/molly
export GOFLAGS ?= -buildvcs=false

# cgo flags for llama.cpp/ggml (DESIGN.md §9). The include folders live in
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

.PHONY: all build run test bench lint model deps clean env
.PHONY: bench-engine

all: build

deps:
	@command -v gcc >/dev/null && command -v g++ >/dev/null || { \
		echo "installing gcc/g++ for cgo (llama.cpp)"; \
		apt-get update -qq && apt-get install -y -qq gcc g++ >/dev/null; }
	$(GO) mod download

build: deps
	$(GO) build -o $(BIN) ./cmd/molly
	$(GO) build -o bin/molly-payments ./plugins/payments
	$(GO) build -o bin/molly-billing ./plugins/billing
	$(GO) build -o bin/molly-support ./plugins/support

# The demo base model and LoRA adapters, generated deterministically (no
# model can be downloaded): ~13 MB GGUF plus four adapters.
model: $(DEMO_MODEL)

$(DEMO_MODEL): | build
	./$(BIN) model demo --out models/demo --seed 1 --size small

run: build model
	./$(BIN) run --config Caddyfile

test: deps
	$(GO) vet ./...
	$(GO) test -timeout $(TEST_TIMEOUT) ./...

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 2s -timeout 30m ./...

# The T0 engine against llama.cpp on the same GGUF (prints the table), the
# 64-adapter hot-budget run and adapter promotion; part of `make bench` too.
bench-engine: deps
	$(GO) test -run '^$$' -bench 'VersusLlamaCpp|HotBudget|AdapterPromotion' -benchtime 1x -timeout 30m ./serving/

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
	rm -rf bin models
