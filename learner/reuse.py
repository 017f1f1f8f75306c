"""AR3PO response reuse (docs/ALGORITHMS.md §3.3-3.5).

What: a per-prompt buffer of the most recent *fresh* correct responses, and the rule that picks
which response of an all-fail group a past correct response replaces. After the replacement the
caller recomputes the group advantages (§3.4: n = 8 gives +2.475 for the reused response and
-0.354 for the others) and sets the reused response's loss mask by reuse mode (§3.5).
Why: an all-fail group has zero advantage and no gradient; one past success gives it a baseline.
The buffer holds plain data only, so its state_dict is JSON for checkpoints (no pickle).

Run the tests with: .venv/bin/python -m pytest tests/test_reuse.py
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

PromptId = int | str


@dataclass(frozen=True)
class ReuseEntry:
    """One stored correct response."""

    token_ids: tuple[int, ...]
    """Response token ids (generated tokens only)."""
    logprobs: tuple[float, ...]
    """Behaviour log-probs per token, needed by `direct_replay` (§3.5)."""
    policy_version: int
    """Version that generated it (v_origin); its age at reuse is v_now - policy_version (§8.4)."""
    step: int
    """Learner step at which it was inserted."""
    reward: float = 1.0
    """Its reward when it was scored (the reward function's; 1 under the built-in math reward,
    and in checkpoints from before reward functions)."""

    def __post_init__(self) -> None:
        # Accept lists from callers and from JSON, store immutable tuples.
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"token_ids ({len(self.token_ids)}) and logprobs ({len(self.logprobs)}) differ in length"
            )


class ReuseBuffer:
    """Per prompt, the `max_per_prompt` most recent correct responses (§3.3 [I]: K_buf = 4).

    Insert only freshly generated correct responses, never reused ones (avoids
    self-amplification). `latest` returns the most recent entry: the smallest age and so the
    smallest off-policyness.
    """

    def __init__(self, max_per_prompt: int = 4) -> None:
        if max_per_prompt < 1:
            raise ValueError(f"max_per_prompt must be >= 1, got {max_per_prompt}")
        self.max_per_prompt = max_per_prompt
        self._entries: dict[PromptId, deque[ReuseEntry]] = {}

    def add(self, prompt_id: PromptId, entry: ReuseEntry) -> None:
        queue = self._entries.setdefault(prompt_id, deque(maxlen=self.max_per_prompt))
        queue.append(entry)

    def latest(self, prompt_id: PromptId) -> ReuseEntry | None:
        queue = self._entries.get(prompt_id)
        return queue[-1] if queue else None

    def pick(self, prompt_id: PromptId, how: str, rng: random.Random) -> ReuseEntry | None:
        """The entry to reuse: `latest`, or `uniform` over the prompt's stored entries (the
        buffer's size then matters: older entries are more off-policy)."""
        queue = self._entries.get(prompt_id)
        if not queue:
            return None
        match how:
            case "latest":
                return queue[-1]
            case "uniform":
                return queue[rng.randrange(len(queue))]
        raise ValueError(f"ar3po.buffer_pick must be 'latest' or 'uniform', got {how!r}")

    def __len__(self) -> int:
        """Number of prompts with at least one stored response."""
        return len(self._entries)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state. Prompt ids are kept as [id, entries] pairs so int ids survive JSON."""
        return {
            "max_per_prompt": self.max_per_prompt,
            "prompts": [
                [
                    prompt_id,
                    [
                        {
                            "token_ids": list(e.token_ids),
                            "logprobs": list(e.logprobs),
                            "policy_version": e.policy_version,
                            "step": e.step,
                            "reward": e.reward,
                        }
                        for e in queue
                    ],
                ]
                for prompt_id, queue in self._entries.items()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the contents with `state`. This buffer's max_per_prompt wins over the saved
        one: if it is smaller, each prompt keeps its most recent entries."""
        entries: dict[PromptId, deque[ReuseEntry]] = {}
        for prompt_id, stored in state["prompts"]:
            queue = deque((ReuseEntry(**e) for e in stored), maxlen=self.max_per_prompt)
            if queue:
                entries[prompt_id] = queue
        self._entries = entries


def reuse_into_group(accs: list[bool], rng: random.Random) -> int | None:
    """Index of the response an all-fail group gives up for a past correct one (§3.3 [I]).

    All responses are incorrect, so a uniform choice is symmetric; the group size is unchanged
    ("replaces one of them" [R:S0]). None when the group is empty or has any correct response.
    """
    if not accs or any(accs):
        return None
    return rng.randrange(len(accs))
