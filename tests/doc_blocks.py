"""The fenced code blocks of README.md and docs/*.md, for tests/test_docs_run.py.

Every ```python block and every ```bash block (also ``sh``, ``shell``, ``console``) of a page is run
by the docs-run tests, in the order of the page. A block that cannot run here (it needs the
network, a GPU, or it is the test suite itself) carries a mark on the line right above its
opening fence, with the reason:

    <!-- docs-run: skip: needs the network (a model download) -->

Other languages (yaml, json, plain text) are not run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*docs-run:\s*(?P<what>[\w-]+)\s*(?::\s*(?P<why>.*?))?\s*-->\s*$")


class DocMarkError(ValueError):
    """A ``<!-- docs-run: ... -->`` mark the collector does not understand (a typo would skip nothing)."""


@dataclass(frozen=True)
class Block:
    """One fenced block: the page, the line of its opening fence (1-based), its language and text."""

    path: Path
    line: int
    lang: str
    text: str
    skip: str | None = None
    """Why the block is not run (its mark's reason); None: it runs."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_python(self) -> bool:
        return self.lang in PYTHON

    @property
    def is_shell(self) -> bool:
        return self.lang in SHELL

    def commands(self) -> list[str]:
        """The shell commands of the block: backslash continuations joined, comments and blank lines dropped."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        found = []
        pending = ""  # a quoted argument that goes on over several lines
        for line in joined.splitlines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # no closing quotation yet
                continue
            pending = ""
            if words:
                found.append(shlex.join(words))
        return found


def doc_pages(root: Path = ROOT) -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a markdown page, with its skip mark.

    Raises:
        DocMarkError: a ``docs-run`` mark that is not ``skip: <reason>``, or one not followed by a fence.
    """
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        mark = _MARK.match(lines[i])
        if mark is not None:
            if mark["what"] != "skip" or not mark["why"]:
                raise DocMarkError(f"{path}:{i + 1}: expected `<!-- docs-run: skip: <reason> -->`, got {lines[i]!r}")
            if i + 1 >= len(lines) or not _FENCE.match(lines[i + 1]):
                raise DocMarkError(f"{path}:{i + 1}: a docs-run mark must be right above a block's opening fence")
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not _FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        above = _MARK.match(lines[start - 1]) if start > 0 else None
        found.append(
            Block(
                path, start + 1, fence[1].lower(), "\n".join(body) + "\n", above["why"] if above is not None else None
            )
        )
        i += 1  # the closing fence
    return found


def runnable(path: Path) -> list[Block]:
    """The page's Python and shell blocks that are not marked to skip, in page order."""
    return [b for b in blocks(path) if (b.is_python or b.is_shell) and b.skip is None]
