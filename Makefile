VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

# torch==2.13.0 (CPU build) goes first and is pinned by constraints.txt, so the project's
# `torch>=2.3` range never replaces it with a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/areal-lightning fit -c examples/arithmetic/grpo.yaml

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/callback_overhead.py
	$(PY) benchmarks/callback_overhead.py --model grpo --steps 400
	$(PY) benchmarks/sharded_eval.py
	$(PY) benchmarks/shard_balance.py
	$(PY) benchmarks/async_overhead.py

clean:
	rm -rf $(VENV) runs wandb lightning_logs
