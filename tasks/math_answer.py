"""The built-in math verdict, as pure functions: the last complete \\boxed{...} of a response,
the verdict when the text alone settles it, and math-verify's verdict otherwise. The verifier
(tasks/verifier.py) runs `math_equal` in its child process; the reward functions
(tasks/rewards.py, `boxed_math`) call them too."""

from __future__ import annotations

_BOXED = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` in `text` (braces balanced), or None.

    A `\\boxed{` whose braces never close (a truncated response) is skipped; `\\{` and `\\}` are
    escaped braces and do not count.
    """
    found = None
    i = text.find(_BOXED)
    while i != -1:
        start = i + len(_BOXED)
        depth, j = 1, start
        while j < len(text) and depth:
            if text[j] == "\\":
                j += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:  # unbalanced: no later \boxed can close either, keep what we have
            break
        found = text[start : j - 1]
        i = text.find(_BOXED, j)
    return found


def quick_verdict(response: str, answer: str) -> bool | None:
    """The verdict when the text alone settles it, without math-verify: no complete \\boxed{}
    is False, a boxed text equal to the answer is True; None = math-verify must judge."""
    boxed = extract_boxed(response)
    if boxed is None:
        return False
    return True if boxed.strip() == answer.strip() else None


def math_equal(boxed: str, answer: str) -> bool:
    """math-verify's verdict on a boxed prediction against a reference answer.

    Runs inside the child: math-verify's own signal timeouts are off (the child's per-item timer
    bounds the whole check instead, and math-verify's `alarm(0)` would cancel it).
    """
    from math_verify import parse, verify

    gold = parse("$" + answer + "$", parsing_timeout=None)
    pred = parse(_BOXED + boxed + "}", parsing_timeout=None)
    return bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
