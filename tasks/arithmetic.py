"""Built-in synthetic arithmetic task family and the `Problem` record every task produces.

Why: the CPU default run needs a task that a tiny model can learn in minutes, whose answers are
exactly checkable, and whose difficulty is a dial (the number of digits). `Arithmetic` provides
that with no files and no downloads.

How it works:
- Level d: the larger operand has exactly d digits (0..9 count as one digit), the other has
  1..d digits (digit count uniform, then the number uniform). "+" and "*" put the operands in
  random order; "-" puts the larger first so answers are non-negative. Question text is
  `"47+385="`, the answer the integer as a string (`"432"`), the golden response `"\\boxed{432}"`,
  or with `response_format="worked"` the column-by-column working first,
  `"7+5=12 4+8+1=13 3+1=4 \\boxed{432}"` (a task whose answers are 20-35 tokens, not 5).
- Train and held-out splits are disjoint and fixed by the questions alone (not by any seed), so
  every run evaluates on problems it never trained on:
  * A *large* level (at least `4 * _HELD_OUT_MODULUS * eval_per_level` distinct questions) puts
    a question in held-out iff `blake2b(question) % _HELD_OUT_MODULUS == 0`; `eval_set()` draws
    `eval_per_level` distinct held-out questions with `Arithmetic.seed`.
  * A *small* level (level 1 has only 155 distinct "+"/"-" questions, so a 1-in-10 hash would
    leave about 15) is enumerated: the `min(eval_per_level, size // 2)` questions with the
    smallest hash are held out, all of them form that level's eval set, and train keeps the
    other half or more. So level 1 with the default ops has 64 eval and 91 train questions;
    the eval count of a small level is capped at half its size.
- Training problem i of stream `seed` is drawn from `random.Random(f"{seed}:{i}")` alone, so
  a resumed run continues at any index in O(1): the stream's whole state is the next index.
  Held-out questions are rejected (redrawn from the same generator).

Run `python -m tasks.arithmetic` to print a few problems of each split.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

_HELD_OUT_MODULUS = 10
"""A question of a large level is held out iff its stable hash is 0 modulo this."""

_MAX_ENUMERATED = 200_000
"""A level with more distinct questions than this is never enumerated (it must be large)."""

_OPS = ("+", "-", "*")


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer, as every task and dataset loader returns it."""

    prompt_id: str
    """Stable id of the question: the same question always has the same id (per-prompt stats)."""
    question: str
    """The problem text shown to the model (before any chat template or instruction)."""
    answer: str
    """Reference answer, checked by the verifier against the response's last \\boxed{...}."""
    level: int = 0
    """Difficulty level (digits for `Arithmetic`; 0 when unknown)."""
    solution: str | None = None
    """A golden response text (used by GCPO), or None when the source has none."""
    fields: dict = field(default_factory=dict, compare=False)
    """What a reward function of the user's sees besides the answer (tasks/rewards.py): a file
    row's top-level fields, the arithmetic task's question and level."""


def stable_hash(text: str) -> int:
    """64-bit hash of `text` that is the same in every process and Python version."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def _digits(n: int) -> int:
    return len(str(n))


def _number_with_digits(rng: random.Random, d: int) -> int:
    low = 0 if d == 1 else 10 ** (d - 1)
    return rng.randrange(low, 10**d)


def level_size(level: int, ops: tuple[str, ...]) -> int:
    """Number of distinct questions of a level: pairs whose larger operand has `level` digits."""
    below, upto = (0 if level == 1 else 10 ** (level - 1)), 10**level
    size = 0
    for op in ops:
        if op == "-":  # unordered pairs a >= b
            size += upto * (upto + 1) // 2 - below * (below + 1) // 2
        else:  # ordered pairs
            size += upto * upto - below * below
    return size


def _question(a: int, op: str, b: int) -> str:
    return f"{a}{op}{b}="


def _answer(a: int, op: str, b: int) -> int:
    match op:
        case "+":
            return a + b
        case "-":
            return a - b
        case "*":
            return a * b
    raise ValueError(f"unknown op {op!r}")


def _enumerate_level(level: int, ops: tuple[str, ...]) -> list[str]:
    """All distinct questions of a level, sorted by (stable hash, text)."""
    questions = []
    for op in ops:
        for a, b in itertools.product(range(10**level), repeat=2):
            if max(_digits(a), _digits(b)) != level or (op == "-" and a < b):
                continue
            questions.append(_question(a, op, b))
    return sorted(questions, key=lambda q: (stable_hash(q), q))


def worked_response(a: int, op: str, b: int, answer: str | None = None) -> str:
    """The column-by-column working of a+b or a-b (a >= b), units first, then `answer` boxed
    (default: the true answer; the warm start's sloppy teacher passes a corrupted one).

    47+385 -> "7+5=12 4+8+1=13 3+1=4 \\boxed{432}"; 52-17 -> "12-7=5 5-1-1=3 \\boxed{35}"."""
    if op not in "+-" or (op == "-" and a < b):
        raise ValueError(f"worked responses are for a+b and a-b with a >= b, got {a}{op}{b}")
    top, bottom = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(top), len(bottom))):
        x = int(top[i]) if i < len(top) else None
        y = int(bottom[i]) if i < len(bottom) else None
        if op == "+":
            terms = [t for t in (x, y) if t is not None] + ([1] if carry else [])
            total = sum(terms)
            steps.append("+".join(map(str, terms)) + f"={total}")
            carry = total // 10
        else:
            value = x - (y or 0) - carry
            borrow = value < 0
            text = str(x + 10 if borrow else x) + (f"-{y}" if y is not None else "")
            steps.append(text + ("-1" if carry else "") + f"={value + 10 * borrow}")
            carry = int(borrow)
    boxed = str(_answer(a, op, b)) if answer is None else answer
    return " ".join(steps) + " \\boxed{" + boxed + "}"


def response_text(question: str, answer: str, response_format: str = "boxed") -> str:
    """The golden response to `question` in `response_format`, boxing `answer`."""
    match response_format:
        case "boxed":
            return "\\boxed{" + answer + "}"
        case "worked":
            return worked_response(*parse_question(question), answer)
    raise ValueError(f"unknown response_format {response_format!r}; expected boxed or worked")


def _problem(a: int, op: str, b: int, level: int, response_format: str = "boxed") -> Problem:
    question, answer = _question(a, op, b), str(_answer(a, op, b))
    return Problem(
        prompt_id="arith:" + question,
        question=question,
        answer=answer,
        level=level,
        solution=response_text(question, answer, response_format),
        fields={"question": question, "level": level},
    )


def parse_question(question: str) -> tuple[int, str, int]:
    body = question.removesuffix("=")
    for op in _OPS:
        left, sep, right = body.partition(op)
        if sep:
            return int(left), op, int(right)
    raise ValueError(f"not an arithmetic question: {question!r}")


def _draw(rng: random.Random, level: int, ops: tuple[str, ...]) -> tuple[int, str, int]:
    """One operand pair of a level from the task's generative distribution."""
    op = rng.choice(ops)
    big = _number_with_digits(rng, level)
    other = _number_with_digits(rng, rng.randint(1, level))
    if op == "-":
        return max(big, other), op, min(big, other)
    return (big, op, other) if rng.random() < 0.5 else (other, op, big)


@dataclass(frozen=True)
class Arithmetic:
    """Integer arithmetic problems by number of digits, with a fixed held-out split."""

    levels: tuple[int, ...] = (1, 2, 3)
    """Difficulty levels to draw from: level d means the larger operand has d digits."""
    ops: tuple[str, ...] = ("+", "-")
    """Operators to use, from "+", "-", "*"."""
    seed: int = 0
    """Seed that picks the eval problems of large levels (the split itself does not depend on it)."""
    eval_per_level: int = 64
    """Held-out problems per level in `eval_set()` (a small level gives at most half its size)."""
    response_format: str = "boxed"
    """Golden responses (`Problem.solution`): "boxed" = the boxed answer alone, "worked" = the
    column-by-column working first (`worked_response`; "+" and "-" only)."""
    _small: dict[int, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.levels or any(d < 1 for d in self.levels) or len(set(self.levels)) != len(self.levels):
            raise ValueError(f"levels must be distinct integers >= 1, got {self.levels}")
        if not self.ops or any(op not in _OPS for op in self.ops) or len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops must be distinct members of {_OPS}, got {self.ops}")
        if self.response_format not in ("boxed", "worked") or (
                self.response_format == "worked" and "*" in self.ops):
            raise ValueError(f"response_format must be 'boxed', or 'worked' with ops + and -, got "
                             f"{self.response_format!r} with ops {self.ops}")
        if self.eval_per_level < 0:
            raise ValueError(f"eval_per_level must be >= 0, got {self.eval_per_level}")
        small: dict[int, frozenset[str]] = {}
        for level in self.levels:
            size = level_size(level, self.ops)
            if size >= 4 * _HELD_OUT_MODULUS * self.eval_per_level:
                continue  # large: hash rule, and rejection sampling finds eval problems fast
            if size > _MAX_ENUMERATED:
                raise ValueError(
                    f"eval_per_level={self.eval_per_level} is too large for level {level} "
                    f"({size} questions): use at most {size // (4 * _HELD_OUT_MODULUS)}"
                )
            held = _enumerate_level(level, self.ops)[: min(self.eval_per_level, size // 2)]
            small[level] = frozenset(held)
        object.__setattr__(self, "_small", small)

    def is_held_out(self, question: str) -> bool:
        """Whether a question belongs to the held-out split (never produced by `train_stream`)."""
        a, _, b = parse_question(question)
        level = max(_digits(a), _digits(b))
        if level in self._small:
            return question in self._small[level]
        return stable_hash(question) % _HELD_OUT_MODULUS == 0

    def eval_set(self) -> list[Problem]:
        """The held-out problems, `eval_per_level` per level (capped for small levels), level by level.

        The same list on every call for the same fields.
        """
        problems: list[Problem] = []
        for level in self.levels:
            if level in self._small:
                chosen = sorted(self._small[level], key=lambda q: (stable_hash(q), q))
                problems += [_problem(*parse_question(q), level, self.response_format)
                             for q in chosen]
                continue
            rng = random.Random(f"eval:{self.seed}:{level}")
            seen: set[str] = set()
            while len(seen) < self.eval_per_level:
                a, op, b = _draw(rng, level, self.ops)
                question = _question(a, op, b)
                if question not in seen and stable_hash(question) % _HELD_OUT_MODULUS == 0:
                    seen.add(question)
                    problems.append(_problem(a, op, b, level, self.response_format))
        return problems

    def train_problem(
        self, seed: int, index: int, level_weights: tuple[float, ...] | None = None
    ) -> Problem:
        """Problem `index` of training stream `seed`: a pure function of its arguments (O(1))."""
        rng = random.Random(f"{seed}:{index}")
        level = rng.choices(self.levels, weights=_check_weights(level_weights, self.levels))[0]
        while True:
            a, op, b = _draw(rng, level, self.ops)
            if not self.is_held_out(_question(a, op, b)):
                return _problem(a, op, b, level, self.response_format)

    def train_stream(
        self, seed: int, level_weights: tuple[float, ...] | None = None, start: int = 0
    ) -> Iterator[Problem]:
        """Endless training problems `start, start+1, ...` of stream `seed`.

        Resume a run by passing the index of the next problem it had not used as `start`.
        `level_weights` (one per level, relative) sets the mix of levels; None is uniform.
        """
        _check_weights(level_weights, self.levels)  # now, not at the first next()
        return (self.train_problem(seed, i, level_weights) for i in itertools.count(start))


def _check_weights(
    level_weights: tuple[float, ...] | None, levels: tuple[int, ...]
) -> tuple[float, ...] | None:
    if level_weights is None:
        return None
    if len(level_weights) != len(levels) or any(w < 0 for w in level_weights) or sum(level_weights) <= 0:
        raise ValueError(
            f"level_weights must be {len(levels)} non-negative numbers with a positive sum "
            f"(one per level of {levels}), got {level_weights}"
        )
    return tuple(level_weights)


if __name__ == "__main__":
    task = Arithmetic()
    print("eval:", [(p.question, p.answer) for p in task.eval_set()[::32]])
    stream = task.train_stream(seed=0)
    print("train:", [(p.question, p.answer) for p in itertools.islice(stream, 8)])
