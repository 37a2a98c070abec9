#!/usr/bin/env bash
# `make test` side by side with the way it ran before (same tests, same code): the run_ddp ranks
# spawned from scratch (RUN_DDP_START_METHOD=spawn) and the vLLM tests after the suite, not beside
# it. Prints the wall time of each; run it on a quiet box, from the repository root.
set -uo pipefail
cd "$(dirname "$0")/.."
make lint > /dev/null || exit 1
start=$(date +%s)
RUN_DDP_START_METHOD=spawn .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder > build/ab_before.log 2>&1
suite=$?
make test-vllm >> build/ab_before.log 2>&1
vllm=$?
before=$(( $(date +%s) - start ))
start=$(date +%s)
make test > build/ab_after.log 2>&1
after_status=$?
after=$(( $(date +%s) - start ))
echo "before (spawned ranks, vLLM tests after the suite): ${before} s (suite exit ${suite}, vLLM exit ${vllm})"
echo "after (make test: ranks from the fork server, vLLM tests beside the suite): ${after} s (exit ${after_status})"
echo "after / before: $(python3 -c "print(f'{${after} / ${before}:.2f}')")"
