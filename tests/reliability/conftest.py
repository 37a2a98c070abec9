"""The shared test helpers live one level up (tests/procs.py, tests/ddp_utils.py ...)."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parents[1])
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
