"""Batched sampling from a Hugging Face causal LM, with the behaviour log-prob of every token.

The learner's held-out evaluation and `rlvr eval` sample with it (`model.generate`, a batch at a
time). The actors' HF engine (actors/engines/hf.py) has a decode loop of its own, which requests
join and leave between steps; both draw from softmax(logits / temperature) with top-p, so an
evaluation number and the actors' behaviour policy mean the same thing.

Log-probs are under the distribution each token was drawn from: softmax(logits / temperature),
before top-p (with the default top_p = 1 that is exactly the sampling distribution). Prompts are
left-padded so every row's last prompt token sits at the same column.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Completion:
    """One sampled response: its tokens (eos included when it stopped), the behaviour log-prob
    of each token under the sampling distribution, and whether it hit `max_new_tokens`."""

    token_ids: list[int]
    logprobs: list[float]
    truncated: bool


def eos_ids(model) -> set[int]:
    """The token ids that end a response of `model` (its generation config: Qwen lists two)."""
    eos = model.generation_config.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}


class HFSampler:
    """Samples from `model` (an HF causal LM) in batches of at most `max_batch` sequences."""

    def __init__(self, model, max_batch: int = 512):
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_token_id = model.generation_config.pad_token_id
        self.eos_ids = eos_ids(model)
        self.eos_token_id = model.generation_config.eos_token_id
        self.max_batch = max_batch

    def generate(self, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[list[Completion]]:
        """n[i] completions of prompts[i]; temperature 0 = greedy decoding (log-probs then under
        the temperature-1 softmax)."""
        rows = [i for i, k in enumerate(n) for _ in range(k)]  # prompt index of every sample
        out: list[list[Completion]] = [[] for _ in prompts]
        for start in range(0, len(rows), self.max_batch):
            chunk = rows[start:start + self.max_batch]
            for i, completion in zip(chunk, self._sample([prompts[i] for i in chunk],
                                                         max_new_tokens, temperature, top_p)):
                out[i].append(completion)
        return out

    @torch.inference_mode()
    def _sample(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                top_p: float) -> list[Completion]:
        was_training = self.model.training
        self.model.eval()
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for r, p in enumerate(prompts):
            input_ids[r, width - len(p):] = torch.tensor(p)
            attention[r, width - len(p):] = 1
        gen = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
            do_sample=temperature > 0, temperature=temperature or None,
            top_p=top_p if temperature > 0 else None, top_k=None,
            max_new_tokens=max_new_tokens, return_dict_in_generate=True, output_logits=True,
            pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id)
        if was_training:
            self.model.train()
        tokens = gen.sequences[:, width:]                                # (B, T)
        # one (B, V) step at a time: a (B, T, V) float tensor is tens of GB at a 150k vocabulary
        token_logp = torch.stack([
            torch.log_softmax(step.float() / (temperature or 1.0), dim=-1).gather(-1, tokens[:, t, None])[:, 0]
            for t, step in enumerate(gen.logits)], dim=1).cpu()          # (B, T)
        tokens = tokens.cpu()
        completions = []
        for r in range(tokens.shape[0]):
            ids = tokens[r].tolist()
            stop = next((i + 1 for i, tok in enumerate(ids) if tok in self.eos_ids), len(ids))
            completions.append(Completion(ids[:stop], token_logp[r, :stop].tolist(),
                                          truncated=stop == len(ids) and ids[-1] not in self.eos_ids))
        return completions
