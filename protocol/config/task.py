"""The task: `task:` (the arithmetic task or a dataset file, the held-out set, the reward,
the prompt template). The class holds its keys' meaning and their rules (`problems(cfg)`,
protocol/config/checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.config.checks import positive


@dataclass(frozen=True)
class TaskConfig:
    kind: Literal["arithmetic", "file"] = "arithmetic"
    """'arithmetic' = the built-in synthetic task; 'file' = your JSONL or parquet files."""
    levels: tuple[int, ...] = (1, 2, 3)
    """Arithmetic: difficulty levels (digits of the larger operand)."""
    level_weights: tuple[float, ...] = (0.35, 0.4, 0.25)
    """Arithmetic: sampling weight of each level in training."""
    ops: tuple[str, ...] = ("+", "-")
    """Arithmetic: operations."""
    eval_per_level: int = 64
    """Arithmetic: held-out prompts per level."""
    train_path: str = ""
    """File task: training data (.jsonl, .parquet, or a folder written by Hugging Face
    datasets' save_to_disk: one split's)."""
    eval_path: str = ""
    """File task: held-out data (as train_path)."""
    prompt_field: str = "prompt"
    """File task: field holding the question (dotted for nested fields)."""
    answer_field: str = "answer"
    """File task: field holding the reference answer."""
    solution_field: str = "solution"
    """File task: optional field holding a golden solution (used by GCPO)."""
    eval_samples: int = 8
    """Samples per held-out prompt for eval/avg@k and eval/pass@k."""
    response_format: Literal["boxed", "worked"] = "boxed"
    """Arithmetic: the answer format the warm start teaches (and GCPO's golden responses):
    boxed = `\\boxed{432}` (about 5 tokens); worked = the column-by-column working first,
    `7+5=12 4+8+1=13 3+1=4 \\boxed{432}` (20-35 tokens; give it rollout.max_new_tokens 64)."""
    reward: str = "math_verify"
    """The reward function: math_verify (built in: 1 when the response's last \\boxed{} equals
    the answer under math-verify, else 0) or "package.module:function", your own: it takes
    (response, answer, fields) and returns a float or a dict of named scores with "reward"
    and optionally "acc" (tasks/rewards.py, docs/TASKS.md); or a weighted sum of
    such functions, "tasks.rewards:boxed_math + 0.2*mymod:brevity" (acc is the first term's)."""
    prompt_template: str = "{question}"
    """User turn text; real models want e.g. "{question} Please reason step by step, and put
    your final answer within \\boxed{{}}."."""

    def problems(self, cfg) -> list[str]:
        """The evaluation's k, a file task's path, the arithmetic task's levels and format."""
        found = positive({"task.eval_samples": self.eval_samples})  # avg@k divides by k
        if self.kind == "file" and not self.train_path:
            found.append("task.train_path is required when task.kind is 'file'")
        if self.kind != "arithmetic":
            return found
        if len(self.levels) != len(self.level_weights):
            found.append("task.level_weights must have one weight per entry of task.levels")
        if not self.levels or min(self.levels) < 1:
            found.append(f"'task.levels' must be a non-empty list of digit counts >= 1, got "
                         f"{list(self.levels)}")
        w = self.level_weights
        if any(x < 0 for x in w) or not sum(w) > 0:
            found.append(f"'task.level_weights' must be >= 0 with a positive sum, got {list(w)}")
        if self.response_format == "worked" and "*" in self.ops:
            found.append(f"'task.response_format' worked is for '+' and '-' only, but "
                         f"'task.ops' is {list(self.ops)}")
        if self.eval_per_level < 1:
            found.append(f"'task.eval_per_level' must be >= 1 (the held-out set would be "
                         f"empty), got {self.eval_per_level}")
        return found
