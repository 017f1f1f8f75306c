"""Reward functions: the built-in math verdict and the user's own (`task.reward`).

A reward function is a module-level Python function

    def my_reward(response: str, answer: str, fields: dict) -> float | dict[str, float]

`response` is the decoded response text, `answer` the row's reference answer and `fields` the
prompt's other data (`Problem.fields`: a file row's other top-level fields, the arithmetic
task's question and level). It returns the reward the learner trains on, or a dict of named
scores: "reward" is the trained one (required), "acc" (optional, default reward > 0) is
correctness, what AR3PO's stop-on-correct, AERO, HORA, reuse and eval/pass@k count, and every
other key is logged as `reward/<name>` (its mean over the step's responses).

It runs in the verifier's child process (tasks/verifier.py) under the same per-item timeout,
kill and restart as math-verify. An exception, a non-numeric or non-finite return, or a dict
without "reward" scores 0 (acc False) and is counted in `reward/errors`; the actor logs the first
such error's traceback once.

`task.reward: math_verify` (the default) is `math_reward` below: 1 when the response's last
\\boxed{...} equals the answer under math-verify, else 0.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

RESERVED = ("mean", "errors", "acc_mean", "train_mean")
"""Names the learner's own reward/* metrics use: a score of that name is refused."""
BUILTIN = "math_verify"
"""`task.reward`'s default: the response's last \\boxed{} against the answer, with math-verify."""


@dataclass(frozen=True)
class Score:
    """One response's score: what the learner trains on and what is logged beside it."""

    reward: float
    acc: bool
    scores: dict[str, float] = field(default_factory=dict)  # logged as reward/<name>
    error: str | None = None  # why it scored 0 without a verdict (exception, bad value, timeout)

    @classmethod
    def of_acc(cls, acc: bool) -> Score:
        return cls(float(acc), bool(acc))

    def as_json(self) -> dict:
        if self.error is not None:
            return {"error": self.error}
        return {"reward": self.reward, "acc": self.acc, "scores": self.scores}

    @classmethod
    def from_json(cls, obj: dict) -> Score:
        if "error" in obj:
            return cls.failed(str(obj["error"]))
        return cls(float(obj["reward"]), bool(obj["acc"]), dict(obj.get("scores", {})))

    @classmethod
    def failed(cls, why: str) -> Score:
        return cls(0.0, False, {}, why)


class RewardError(ValueError):
    """`task.reward` names nothing callable as a reward function (import error, signature)."""


def resolve(ref: str) -> Callable:
    """The function `ref` ("package.module:function") names, its signature checked: it must
    take (response, answer, fields) positionally. Raises RewardError with the reason."""
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise RewardError(f"{ref!r} is not 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as e:  # noqa: BLE001 - the user's module: any import failure is theirs
        raise RewardError(f"{ref!r} cannot be imported: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise RewardError(f"{ref!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind("response", "answer", {})
    except TypeError as e:
        raise RewardError(f"{ref!r} must take (response, answer, fields): {e}") from e
    except ValueError:  # builtins without a signature: let the call say
        pass
    return fn


def normalize(value) -> Score:
    """A reward function's return value as a Score, or a failed one saying what was wrong."""
    if isinstance(value, dict):
        if "reward" not in value:
            return Score.failed(f"returned a dict without 'reward' (keys {sorted(value)})")
        reward = _number(value["reward"])
        if reward is None:
            return Score.failed(f"returned reward {value['reward']!r}, not a finite number")
        scores = {}
        for name, v in value.items():
            if name in ("reward", "acc"):
                continue
            number = _number(v)
            if name in RESERVED:
                return Score.failed(f"returned score {name!r}: reward/{name} is the learner's "
                                    f"(reserved: {', '.join(RESERVED)})")
            if number is None:
                return Score.failed(f"returned score {name!r} = {v!r}, not a finite number")
            scores[str(name)] = number
        acc = value.get("acc", reward > 0)
        if _number(acc) is None:
            return Score.failed(f"returned acc {acc!r}, not a bool or number")
        return Score(reward, bool(acc), scores)
    reward = _number(value)
    if reward is None:
        return Score.failed(f"returned {value!r} ({type(value).__name__}), not a finite number "
                            "or a dict")
    return Score(reward, reward > 0)


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    try:  # numpy and torch scalars
        number = float(value.item())
    except (AttributeError, TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
