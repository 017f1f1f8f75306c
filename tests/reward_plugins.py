"""Reward functions the tests name in `task.reward` (importable by the verifier's child)."""

import os
import time


def exact(response: str, answer: str, fields: dict) -> dict:
    """1 when the response ends with the answer; logs its length and the prompt's level."""
    return {"reward": float(response.strip().endswith(answer)), "chars": len(response),
            "level": fields.get("level", -1)}


def graded(response: str, answer: str, fields: dict) -> float:
    """A partial-credit reward: acc is reward > 0."""
    return 0.5 if answer in response else 0.0


def misbehaving(response: str, answer: str, fields: dict):
    """What a reward function can do wrong, chosen by the response text."""
    if response == "raise":
        raise ValueError("no verdict for " + response)
    if response == "text":
        return "1"
    if response == "nan":
        return float("nan")
    if response == "no reward":
        return {"acc": True}
    if response == "reserved":
        return {"reward": 1.0, "mean": 0.3}
    if response == "sleep":
        time.sleep(60)
    if response == "exit":
        os._exit(5)
    return 1.0


def two_args(response: str, answer: str) -> float:
    return 0.0


NOT_A_FUNCTION = 3


def brevity(response: str, answer: str, fields: dict) -> dict:
    """1 for an empty response, falling with its length; logs the length."""
    return {"reward": 1.0 / (1.0 + len(response)), "chars": len(response)}


def by_level(response: str, answer: str, fields: dict) -> float:
    """The built-in boxed check, for a row that names its level (a KeyError without fields)."""
    level = fields["level"]
    return float(level >= 1 and response.strip() == f"\\boxed{{{answer}}}")


def never(response: str, answer: str, fields: dict) -> float:
    """Every response wrong, at once: each of AR3PO's stages runs."""
    return 0.0


def never_slowly(response: str, answer: str, fields: dict) -> float:
    """Every response wrong, after 20 ms: verdicts come back decode steps later."""
    time.sleep(0.02)
    return 0.0


_calls = 0


def slow_first(response: str, answer: str, fields: dict) -> dict:
    """`exact`, but the first item a verifier's process scores takes a minute: past any
    `actors.verifier_timeout_s` a test sets."""
    global _calls
    _calls += 1
    if _calls == 1:
        time.sleep(60)
    return exact(response, answer, fields)
