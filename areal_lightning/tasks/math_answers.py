"""Finding a math answer and comparing it: the reference in a GSM8K or MATH row, the final answer
of a completion, and the two verifiers (math-verify where installed, else `numeric_equal`)."""

from __future__ import annotations

import re
import threading
from enum import Enum
from fractions import Fraction
from typing import Any

CORRECT_REWARD = 1.0  # what `rollout_evaluate` counts as correct, as for the arithmetic task
WRONG_REWARD = 0.0
NUMERIC_REL_TOL = 1e-6
"""`numeric_equal` treats two numbers as equal within this relative tolerance (0.333333 == 1/3)."""
MATH_VERIFY_TIMEOUT_S = 5
"""math-verify's own per-call timeout; it uses SIGALRM, so it applies on the main thread only (the
`SafeScorer` worker's main thread included); `MathTask(score_timeout_s=...)` applies on any thread."""


class AnswerFormat(str, Enum):
    """Where a row's reference answer is written."""

    GSM8K = "gsm8k"
    """After the last ``####`` of the field (GSM8K's ``answer``: worked solution, then ``#### 72``)."""
    BOXED = "boxed"
    """In the last ``\\boxed{...}`` of the field (MATH's ``solution``)."""
    PLAIN = "plain"
    """The whole field (MATH-500's ``answer``)."""


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """The content of the last closed ``\\boxed{...}`` (or ``\\fbox{...}``) in `text`, nested braces
    included; None when there is none."""
    for opening in reversed(list(_BOXED.finditer(text))):
        depth = 1
        for i in range(opening.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[opening.end() : i].strip()
    return None


def extract_after_hashes(text: str) -> str | None:
    """The rest of the line after the last ``####`` (GSM8K's final-answer marker)."""
    if "####" not in text:
        return None
    answer = text.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()
    return answer or None


def reference_answer(field: str, answer_format: AnswerFormat) -> str | None:
    """The reference answer of a row's answer field."""
    if answer_format is AnswerFormat.GSM8K:
        return extract_after_hashes(field)
    if answer_format is AnswerFormat.BOXED:
        return extract_boxed(field)
    return field.strip() or None


_NUMBER = re.compile(r"-?\\[dt]?frac\{\d+\}\{\d+\}|-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)


def final_answer(completion: str) -> str | None:
    """A completion's final answer: the last ``\\boxed{}``, else what follows the last ``####``,
    else what follows the last "answer is", else the last number (``\\frac{3}{4}`` included);
    None when there is none."""
    for found in (extract_boxed(completion), extract_after_hashes(completion)):
        if found is not None:
            return found
    matches = _ANSWER_IS.findall(completion)
    if matches:
        return matches[-1].split("\n", 1)[0].strip()
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


# ----------------------------------------------------------------------------- the numeric fallback
_UNIT_SUFFIX = re.compile(r"^([-+]?[\d.,/]+)\s*[a-zA-Z][a-zA-Z\s.]*$")
_FRAC = re.compile(r"\\[dt]?frac\{([-+]?[\d.]+)\}\{([-+]?[\d.]+)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac(\d)(\d)")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_ASSIGNMENT = re.compile(r"^[a-zA-Z]\w*\s*=\s*(.+)$")
_NUMERIC = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:/(?:\d+\.?\d*|\.\d+))?")
_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "\\%", "%", "^\\circ", "^{\\circ}", "°")


def normalize_answer(text: str) -> str:
    """A final answer in a canonical spelling: ``\\boxed{}``, ``$``, ``%``, degree signs, thousands
    separators, a leading ``x =``, ``\\text{}`` wrappers, trailing unit words (``18 dollars``) and
    whitespace removed; ``\\frac{1}{2}`` (and ``\\dfrac``, ``\\frac12``) written ``1/2``."""
    s = text.strip()
    while s.startswith(("\\boxed", "\\fbox")) and (inner := extract_boxed(s)) is not None:
        s = inner
    for token in _DROP:
        s = s.replace(token, "")
    s = _TEXT.sub(lambda m: m.group(1), s)
    s = _FRAC.sub(r"\1/\2", s)
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    s = _THOUSANDS.sub("", s).strip().rstrip(".").strip()
    if (assignment := _ASSIGNMENT.match(s)) is not None:
        s = assignment.group(1).strip()
    if (unit := _UNIT_SUFFIX.match(s)) is not None:
        s = unit.group(1)
    return re.sub(r"\s+", "", s).rstrip(".")


def parse_number(text: str) -> Fraction | None:
    """The exact value of a normalised answer such as ``-3``, ``0.5`` or ``3/4``; None otherwise."""
    if not _NUMERIC.fullmatch(text):
        return None
    numerator, _, denominator = text.partition("/")
    try:
        return Fraction(numerator) / Fraction(denominator or "1")
    except ZeroDivisionError:
        return None


def canonical_answer(completion: str) -> str | None:
    """The normal form of a completion's final answer: its value when numeric (``1/2``), else
    its normalised text; None when there is no answer."""
    answer = final_answer(completion)
    if answer is None:
        return None
    normal = normalize_answer(answer)
    value = parse_number(normal)
    return str(value) if value is not None else (normal or None)


def numeric_equal(completion: str, reference: str) -> bool:
    """The fallback verifier: the completion's `final_answer` equals `reference` as a number
    (within `NUMERIC_REL_TOL`), or, when either is not a number, as `normalize_answer` text.

    ``\\boxed{1,000}`` == ``1000``; ``#### 0.5`` == ``1/2``; ``\\frac{1}{2}`` == ``0.5``;
    ``18 dollars`` == ``$18`` == ``18``; ``50\\%`` == ``50``. Symbolic answers (``\\sqrt{3}/2``
    against ``\\frac{\\sqrt3}{2}``) need math-verify.
    """
    answer = final_answer(completion)
    if answer is None:
        return False
    got, want = normalize_answer(answer), normalize_answer(reference)
    got_value, want_value = parse_number(got), parse_number(want)
    if got_value is not None and want_value is not None:
        return abs(got_value - want_value) <= NUMERIC_REL_TOL * max(Fraction(1), abs(want_value))
    return bool(want) and got == want


def numeric_score(completion: str, reference: str) -> float | None:
    """`numeric_equal` as a reward; None when the completion has no final answer."""
    if final_answer(completion) is None:
        return None
    return CORRECT_REWARD if numeric_equal(completion, reference) else WRONG_REWARD


def verify_target(completion: str) -> str:
    r"""What math-verify parses of a completion: its marked final answer, so that text after it
    (a model going on with the next question, a check "3 + 4 = 7") is not taken for the answer.
    The last ``\boxed{}`` (kept boxed), else what follows the last ``####``, else what follows
    the last "answer is"; without a marker the whole completion (math-verify then takes its last
    expression, LaTeX included).

    Example:
        >>> verify_target("10/30 = 33.333...%, which rounds down to 33%\n#### 33\nQuestion: 5 pens cost $2")
        '33'
        >>> print(verify_target(r"so \boxed{\frac{1}{2}}. Check: 3 + 4 = 7"))
        \boxed{\frac{1}{2}}
    """
    boxed = extract_boxed(completion)
    if boxed is not None:
        return f"\\boxed{{{boxed}}}"
    after_hashes = extract_after_hashes(completion)
    if after_hashes is not None:
        return after_hashes
    answer_is = _ANSWER_IS.findall(completion)
    if answer_is:
        return str(answer_is[-1]).split("\n", 1)[0].strip()
    return completion


def _math_verify_parse(completion: str, timeout: float | None) -> list[Any]:
    """math-verify's parse of the completion's `verify_target`; a bare LaTeX answer after a
    marker (``#### \\sqrt{3}/2``) is parsed boxed when it does not parse as it is."""
    from math_verify import parse  # the `math` extra; imported only when used

    target = verify_target(completion)
    parsed = list(parse(target, parsing_timeout=timeout))
    if not parsed and target != completion:
        parsed = list(parse(f"\\boxed{{{target}}}", parsing_timeout=timeout))
    return parsed


def math_verify_score(completion: str, reference: str) -> float | None:
    """math-verify's verdict on the completion's final answer (`verify_target`) as a reward;
    None when it parses no answer.

    Module-level, so that `SafeScorer` workers can import it.
    """
    from math_verify import parse, verify  # the `math` extra; imported only when used

    # math-verify times out with SIGALRM, which Python allows on the main thread only.
    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    predicted = _math_verify_parse(completion, timeout)
    if not predicted:
        return None
    # Boxing makes a bare reference ("72", "\\frac{1}{2}") parse as LaTeX.
    gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)
    return CORRECT_REWARD if gold and verify(gold, predicted, timeout_seconds=timeout) else WRONG_REWARD
