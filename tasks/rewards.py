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

`task.reward: math_verify` (the default) is the built-in: 1 when the response's last
\\boxed{...} equals the answer under math-verify, else 0 (tasks/verifier.py, with fast paths in
the parent); `tasks.rewards:boxed_math` is the same verdict as a plain reward function.

Several functions, weighted: `task.reward: "tasks.rewards:boxed_math + 0.2*mymod:brevity"`
(a term is `[weight*]module:function`, the weight 1 when left out). The trained reward is the
weighted sum; `acc` is the first term's (the task's correctness); each term's own reward is
logged as `reward/<function>` and its named scores as `reward/<function>/<name>`. One term
that fails (raises, returns a bad value) fails the whole score: 0, counted in `reward/errors`.
A weight of 0, a weight that is not a finite number, or two terms of one function are refused.
"""

from __future__ import annotations

import importlib
import inspect
import math
import traceback
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


@dataclass(frozen=True)
class Term:
    weight: float
    ref: str  # "package.module:function"

    @property
    def name(self) -> str:
        return self.ref.partition(":")[2]


def parse_terms(spec: str) -> list[Term]:
    """`task.reward` as its weighted terms ("mod:f", "mod:f + 0.2*mod:g", "-0.1*mod:h" ...);
    RewardError on a term that is not `[weight*]module:function`, a weight that is 0 or not a
    finite number, or one function twice."""
    terms = []
    for raw in spec.replace("- ", "+ -").split("+"):  # "a - 0.1*b" is "a + -0.1*b"
        text = raw.strip()
        weight_text, star, ref = text.rpartition("*")
        if not star and text.startswith("-"):  # "-mod:f": weight -1
            weight_text, star, ref = "-1", "*", text[1:]
        try:
            weight = float(weight_text) if star else 1.0
        except ValueError:
            raise RewardError(f"{text!r}: the weight {weight_text!r} is not a number") from None
        if not math.isfinite(weight) or weight == 0:
            raise RewardError(f"{text!r}: the weight must be a finite number other than 0 "
                              f"(a term of weight 0 does nothing)")
        terms.append(Term(weight, ref.strip()))
    names = [t.name for t in terms]
    if len(terms) > 1 and (clash := set(names) & set(RESERVED)):
        raise RewardError(f"{spec!r}: reward/{sorted(clash)[0]} is the learner's own metric "
                          f"(reserved: {', '.join(RESERVED)}); rename the function")
    if len(set(names)) < len(names):
        raise RewardError(f"{spec!r}: a function appears twice (its scores would be logged "
                          "under one name)")
    return terms


def resolve_judge(spec: str) -> Callable[[str, str, dict], Score]:
    """The (response, answer, fields) -> Score of `task.reward` (a user's function or a
    weighted sum of several); every function imported and its signature checked now
    (RewardError)."""
    terms = parse_terms(spec)
    fns = [resolve(t.ref) for t in terms]
    if len(terms) == 1 and terms[0].weight == 1.0:
        return lambda response, answer, fields: normalize(fns[0](response, answer, fields))

    def judge(response: str, answer: str, fields: dict) -> Score:
        total, scores, acc = 0.0, {}, False
        for i, (term, fn) in enumerate(zip(terms, fns)):
            try:
                s = normalize(fn(response, answer, fields))
            except Exception:  # noqa: BLE001 - the user's function: scored 0 with its name
                return Score.failed(f"{term.ref}: {traceback.format_exc(limit=-8).strip()}")
            if s.error is not None:
                return Score.failed(f"{term.ref}: {s.error}")
            total += term.weight * s.reward
            acc = s.acc if i == 0 else acc
            scores[term.name] = s.reward
            scores.update({f"{term.name}/{k}": v for k, v in s.scores.items()})
        return Score(total, acc, scores)

    return judge


def check_answers(spec: str) -> list[tuple[str, Callable]]:
    """(function ref, its `check_answer`) of every term that has one (rlvr data check)."""
    return [(t.ref, check) for t in parse_terms(spec)
            if (check := getattr(resolve(t.ref), "check_answer", None)) is not None]


def boxed_math(response: str, answer: str, fields: dict) -> float:
    """The built-in math verdict as a reward function: 1.0 when the response's last \\boxed{}
    equals the answer under math-verify, else 0.0 (a term of a weighted sum)."""
    from tasks.math_answer import extract_boxed, math_equal, quick_verdict

    verdict = quick_verdict(response, answer)
    if verdict is None:
        verdict = math_equal(extract_boxed(response), answer)
    return float(verdict)


def _math_verify_parses(answer: str) -> None:
    from math_verify import parse

    if not parse("$" + answer + "$"):
        raise ValueError("math-verify cannot parse it")


boxed_math.check_answer = _math_verify_parses  # rlvr data check: every answer judgeable


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
