# make demo: set up and run the main job. make test: set up and run the test suite.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test bench bench-llm setup toolchains clean

$(STAMP): requirements-dev.txt pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (set PY=python3.x)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q -e . --no-deps
	touch $(STAMP)

setup: $(STAMP) toolchains

# cross compilers and emulators for the foreign targets (cuvil/target.py names the Debian packages):
# installed with apt-get where we are root (as CI is); elsewhere their tests skip and say why
toolchains:
	@pkgs="$$($(PY) cuvil/target.py)"; \
	if [ -z "$$pkgs" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $$pkgs"; \
		apt-get install -y -q $$pkgs >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $$pkgs >/dev/null; } \
		|| echo "could not install $$pkgs: the cross-target tests will skip"; \
	else echo "not root or no apt-get: $$pkgs not installed, the cross-target tests will skip"; fi

demo: $(STAMP)
	$(BIN)/python -m benchmarks.demo

test: $(STAMP) toolchains
	$(BIN)/python -m pytest -q -n 2 --durations=15

bench: $(STAMP)
	$(BIN)/pip install -q -r benchmarks/requirements.txt
	$(BIN)/python -m benchmarks.run

# the LLM table: builds llama.cpp from source the first time (about 15 minutes on 2 cores). Without
# its AMX backend: on this project's Sapphire-Rapids-class VMs it segfaults in the first quantized
# matmul (ggml-org/llama.cpp#20824); the AVX-512 VNNI kernels are what it runs instead. GGML_AMX_*=OFF
# does not do it: -march=native turns AMX back on, and an explicit -mno-amx-* outranks -march
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMACPP_CMAKE := -DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
bench-llm: $(STAMP)
	$(BIN)/pip install -q -r benchmarks/requirements.txt
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" $(BIN)/pip install -q -r benchmarks/requirements-llamacpp.txt
	$(BIN)/python -m benchmarks.llm

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
