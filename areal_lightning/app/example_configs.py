"""`areal-lightning example`: the example configs that ship inside the package, printed or written out.

They live in ``areal_lightning/app/configs/`` (package data), so an installed wheel has them and
nothing depends on a checkout of the repository.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from areal_lightning.app.console import fail

CONFIG_SUFFIX = ".yaml"


def example_names() -> list[str]:
    """The names of the packaged example configs, sorted.

    Example:
        >>> "arithmetic_grpo" in example_names()
        True
    """
    root = resources.files("areal_lightning.app") / "configs"
    return sorted(p.name[: -len(CONFIG_SUFFIX)] for p in root.iterdir() if p.name.endswith(CONFIG_SUFFIX))


def example_text(name: str) -> str:
    """The YAML text of the packaged example config `name`.

    Raises:
        ValueError: for a name that is not one of `example_names()`.

    Example:
        >>> example_text("arithmetic_grpo").splitlines()[0]
        '# The main job: GRPO on one-digit addition, from a format-only warm-up, on a CPU.'
    """
    names = example_names()
    if name not in names:
        raise ValueError(f"no example config {name!r}; the examples are: {', '.join(names)}")
    return (resources.files("areal_lightning.app") / "configs" / f"{name}{CONFIG_SUFFIX}").read_text(encoding="utf-8")


def add_example_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="the example to print or write; none: list the examples")
    parser.add_argument("-o", "--output", help="write the config to this file (refused if it exists) instead of stdout")


def example_main(args: argparse.Namespace) -> int:
    """Lists the examples, prints one, or writes one to ``--output``."""
    if args.name is None:
        print("\n".join(example_names()))
        return 0
    try:
        text = example_text(args.name)
    except ValueError as err:
        return fail(str(err))
    if args.output is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.exists():
        return fail(f"--output {args.output!r} exists; give a new file name (an example never overwrites a file)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}; run it with: areal-lightning fit -c {out}")
    return 0
