"""What a model grader's arguments must be, checked without torch: the Python graders
(`rl.model_graders`) and the config's ``graders`` section word the same problems in their own terms.

Each check returns why a value is refused, or None; the caller names the argument or the key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from areal_lightning.scoring import ScoreLabels

JUDGE_LABELS = ScoreLabels("judge", ("correct", "incorrect", "unparsed"), shares=True)
"""The judge's verdicts, counted per round (with shares: ``judge/unparsed_share``)."""
DEFAULT_RUBRIC = (
    "You grade an answer to a question.\nQuestion: {prompt}\nReference answer: {answer}\n"
    "Answer to grade: {completion}\nIs the answer correct? Reply with VERDICT: CORRECT or VERDICT: INCORRECT.\n"
)
"""The judge's prompt; ``{prompt}``, ``{completion}`` and ``{answer}`` are filled in."""
DEFAULT_VERDICT = r"VERDICT:\s*(CORRECT|INCORRECT)"
"""The verdict's pattern: its first group, compared with the judge's `correct_word`."""
RM_ACCEPTED = "a local directory of a model with a sequence-classification head (`...ForSequenceClassification`)"
NEVER_DOWNLOADED = (
    "graders never download models: save the model and tokenizer with `save_pretrained` "
    "(or `huggingface-cli download NAME --local-dir DIR` on a machine with network) and pass that directory"
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A saved tokenizer writes at least one of these (fast tokenizers: the first two)."""


def model_dir_problem(path: str | Path) -> str | None:
    """Why `path` is not a local directory holding a saved model and its tokenizer, or None; a hub
    name is a missing directory (never looked up).

    Example:
        >>> model_dir_problem("OpenAssistant/reward-model")
        'no such local directory'
    """
    directory = Path(path).expanduser()
    if not directory.is_dir():
        return "no such local directory"
    if not (directory / "config.json").is_file():
        return "the directory has no config.json, so it holds no saved model"
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        return f"the directory holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
    return None


def classification_head_problem(directory: str | Path) -> str | None:
    """Why the model saved in `directory` is no sequence classifier (read from its config.json), or None."""
    try:
        architectures = json.loads((Path(directory).expanduser() / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        architectures = None
    architectures = architectures or []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return None
    return f"its config.json names {architectures or 'no architecture'}, so the score head would be random"


def template_problem(template: str) -> str | None:
    """Why the judge's rubric cannot be filled in, or None.

    Example:
        >>> template_problem("Grade {completion} against {answer}")
        'it must contain {prompt} and {completion}'
        >>> template_problem("{prompt} {completion} {q}")
        "it names a field other than {prompt}, {completion} and {answer} ('q'); write a literal brace twice: {{ }}"
    """
    if "{prompt}" not in template or "{completion}" not in template:
        return "it must contain {prompt} and {completion}"
    try:
        template.format(prompt="", completion="", answer="")
    except KeyError as err:
        return (
            f"it names a field other than {{prompt}}, {{completion}} and {{answer}} ({err}); "
            "write a literal brace twice: {{ }}"
        )
    except (ValueError, IndexError) as err:
        return f"it is not a format string ({err}); write a literal brace twice: {{{{ }}}}"
    return None


def verdict_pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot find the judge's verdict, or None.

    Example:
        >>> verdict_pattern_problem("VERDICT: CORRECT")
        'it has no group: put the verdict word in parentheses, e.g. VERDICT:\\\\s*(CORRECT|INCORRECT)'
    """
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        return f"it is not a regular expression ({err})"
    if compiled.groups < 1:
        return rf"it has no group: put the verdict word in parentheses, e.g. {DEFAULT_VERDICT}"
    return None
