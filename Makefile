# make demo: set up and run the main job. make test: set up and run the test suite.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test bench bench-llm setup clean

$(STAMP): requirements-dev.txt pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (set PY=python3.x)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q -e . --no-deps
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m benchmarks.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --durations=15

bench: $(STAMP)
	$(BIN)/pip install -q -r benchmarks/requirements.txt
	$(BIN)/python -m benchmarks.run

# the LLM table: builds llama.cpp from source the first time (about 15 minutes on 2 cores)
bench-llm: $(STAMP)
	$(BIN)/pip install -q -r benchmarks/requirements.txt
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(BIN)/pip install -q -r benchmarks/requirements-llamacpp.txt
	$(BIN)/python -m benchmarks.llm

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
