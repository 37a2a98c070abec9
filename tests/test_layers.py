"""Dependencies point one way: tasks <- rl <- app, with the plugin below them all. Importing the
callback and the metrics loads nothing of the app; no module imports a package above its own, not
even lazily (inside a function) or for type checking."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "areal_lightning"
PLUGIN = ("callbacks", "metrics", "eval_round", "scoring", "tracking", "viz", "errors")
APP = ("areal_lightning.app", "areal_lightning.rl", "areal_lightning.tasks")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


@pytest.mark.process
def test_a_user_of_the_callback_and_the_metrics_loads_no_app_module() -> None:
    loaded = _loaded_after(
        "from areal_lightning.callbacks import EvaluationCallback\n"
        "from areal_lightning.metrics import RewardMetric\n"
        "from areal_lightning.eval_round import run_round\n"
        "from areal_lightning.tracking.loggers import log_eval_results"
    )
    assert "areal_lightning.callbacks.evaluation_callback" in loaded  # the probe did load the plugin
    assert [m for m in loaded if m.startswith(APP)] == []


def _imports(path: Path, package: Path) -> list[tuple[str, ...]]:
    """Each import of `path`: the modules it may load, the named module first (``from a import b``
    may load ``a.b``; a relative import is resolved against the module's own package)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = (package.name, *path.relative_to(package).parent.parts)
                base = ".".join(p for p in (*here[: len(here) - node.level + 1], base) if p)
            found.append((base, *(f"{base}.{alias.name}" for alias in node.names)))
        elif isinstance(node, ast.Import):
            found += [(alias.name,) for alias in node.names]
    return found


FORBIDDEN = {
    **{part: APP for part in PLUGIN},
    "tasks": ("areal_lightning.rl", "areal_lightning.app"),
    "rl": ("areal_lightning.app",),
}
"""Each package (or module) and the packages it must not import: those above it."""


def layer_offenders(package: Path) -> dict[str, list[str]]:
    """`{module: [imported modules of a package above its own]}`, imports inside functions included."""
    offenders = {}
    for part, above in FORBIDDEN.items():
        root = package / part
        paths = sorted(root.rglob("*.py")) if root.is_dir() else [package / f"{part}.py"]
        for path in (p for p in paths if p.is_file()):
            loads = [next((m for m in names if m.startswith(above)), None) for names in _imports(path, package)]
            bad = sorted({m for m in loads if m is not None})
            if bad:
                offenders[str(path.relative_to(package))] = bad
    return offenders


def test_no_package_imports_one_above_it_not_even_lazily() -> None:
    assert layer_offenders(PACKAGE) == {}


def test_the_layer_check_finds_a_lazy_import_of_the_app_in_rl(tmp_path: Path) -> None:
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "module.py").write_text("def build():\n    from areal_lightning.app.config import Config\n")
    assert layer_offenders(tmp_path) == {"rl/module.py": ["areal_lightning.app.config"]}


@pytest.mark.parametrize(
    "spelling",
    ["from areal_lightning import app", "from ..app import config", "from .. import app", "import areal_lightning.app"],
)
def test_the_layer_check_finds_every_spelling_of_an_import_of_the_app(tmp_path: Path, spelling: str) -> None:
    package = tmp_path / "areal_lightning"
    (package / "rl").mkdir(parents=True)
    (package / "rl" / "module.py").write_text(f"def build():\n    {spelling}\n")
    assert list(layer_offenders(package)) == ["rl/module.py"]


def test_no_module_imports_a_private_name_from_another_package() -> None:
    # Within one package a private helper may be shared, as torchmetrics' classes use the `_update`
    # and `_compute` of their functional module; across packages only public names travel.
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("areal_lightning")
                and node.module.rsplit(".", 1)[0] != package
            ):
                offenders += [
                    f"{path.relative_to(PACKAGE)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"
                ]
    assert offenders == []


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("areal_lightning"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(paths)
                edges |= subs or {node.module}
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name.startswith("areal_lightning")}
        graph[name] = edges - {name}
    return graph


def test_the_package_has_no_import_cycle_between_modules() -> None:
    graph = _module_graph()
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == []


if __name__ == "__main__":
    print(json.dumps({k: sorted(v) for k, v in _module_graph().items()}, indent=1))


PREFIX_FOLDER_AT = 5
"""A name prefix that five modules of one folder share is a folder that has not been made (the
`episode_*`, `vllm_*`/`hf_*` and GRPO modules once stood side by side in `rl/`)."""


def crowded_prefixes(package: Path) -> dict[str, list[str]]:
    """Per folder and prefix (the part of a module's name before its first ``_``), the modules that
    share it, where they are `PREFIX_FOLDER_AT` or more."""
    groups: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            key = f"{path.parent.relative_to(package).as_posix()}/{path.stem.split('_')[0]}"
            groups.setdefault(key, []).append(path.name)
    return {key: names for key, names in groups.items() if len(names) >= PREFIX_FOLDER_AT}


def test_no_folder_holds_a_prefix_that_should_be_a_folder(tmp_path: Path) -> None:
    (tmp_path / "rl").mkdir()
    for name in ("episode_eval", "episode_metrics", "episode_training", "episode_settings", "episodes", "grpo"):
        (tmp_path / "rl" / f"{name}.py").write_text("")
    assert crowded_prefixes(tmp_path) == {}  # four share `episode`: not yet a crowd
    (tmp_path / "rl" / "episode_completions.py").write_text("")
    assert crowded_prefixes(tmp_path) == {
        "rl/episode": [
            "episode_completions.py",
            "episode_eval.py",
            "episode_metrics.py",
            "episode_settings.py",
            "episode_training.py",
        ]
    }
    assert crowded_prefixes(PACKAGE) == {}
