"""Hugging Face transformers engine with its own KV-cache decode loop (CPU, or one GPU).

What: one request is one sample. Requests can be added before any decode step and aborted at
any time; `step()` decodes one token for every running request and returns the requests that
finished. Every token records the policy version of the weights that produced it and its
behaviour log-prob under softmax(logits / temperature), before top-p (tasks/sampling.py).

Who samples with it: the actors (`actors.engine: hf`), the learner's held-out evaluation (around
its own training module), `rlvr eval` and the evaluation on actors, so every number a run logs
was sampled by one loop.

Why its own loop and not `model.generate`: `generate` runs a fixed batch to the end, so a weight
sync, a prompt's next stage or the abort of a sample whose sibling is already correct would all
wait for the slowest sequence of the batch. Here each of those happens between two decode steps.

How the batch is kept (`tasks/kv_slots.py`): each running row has a slot of one
preallocated KV cache, its tokens right-aligned to a write column shared by all rows and its
left columns masked out. New requests are prefilled together and written into free slots;
finished and aborted rows free theirs. Nothing is copied when rows come and go. A row's
positions count its own tokens only, so its log-probs do not depend on the other rows
(tests/test_hf_engine.py checks them against one full forward pass within 1e-5).

Weights: the learner's broadcast writes straight into the model's parameters between two
`step()` calls (nothing to commit). The cache keeps the keys and values computed under the old
weights, as vLLM's KV cache does, and each token's log-prob is the one it was sampled with.

    engine = HFEngine.load("runs/demo/checkpoints/step_200/hf")
    engine.add(0, prompt_ids, max_new_tokens=8)
    while engine.unfinished():
        for done in engine.step(): print(done.token_ids, done.version_runs)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM

from tasks.kv_slots import KVSlots
from tasks.sampling import Aborted, Completion, Finished, eos_ids, extend_version_runs, generate_all


@dataclass
class _Request:
    request_id: int
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_runs: list[tuple[int, int]] = field(default_factory=list)  # (version, tokens)
    compute_s: float = 0.0  # this request's share of the decode steps it took part in

    def append(self, token: int, logprob: float, version: int) -> None:
        self.tokens.append(token)
        self.logprobs.append(logprob)
        extend_version_runs(self.version_runs, version, 1)


class HFEngine:
    def __init__(self, model, max_batch: int = 512):
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_token_id = model.generation_config.pad_token_id
        self.eos_ids = eos_ids(model)
        self.max_batch = max_batch
        self.policy_version = 0
        """Version of the weights in the model now: every token sampled is tagged with it."""
        self._waiting: OrderedDict[int, _Request] = OrderedDict()
        self._kv = KVSlots()
        self._slots: list[_Request | None] = []  # the running request in each slot the cache uses
        # each slot's sampled token, not yet cached; on the model's device, as the tokens are
        self._last = torch.zeros(0, dtype=torch.long, device=self.device)

    @classmethod
    def load(cls, model_path: str, device: str = "cpu", dtype: str = "float32",
             max_batch: int = 512) -> "HFEngine":
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        model = model.to(device).eval()
        model.requires_grad_(False)
        return cls(model, max_batch)

    # -- requests -----------------------------------------------------------------------------
    def add(self, request_id: int, prompt_token_ids: list[int], max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0) -> None:
        if request_id in self._waiting or request_id in self.running():
            raise ValueError(f"request {request_id} is already in the engine")
        if max_new_tokens < 1 or not prompt_token_ids:
            raise ValueError(f"request {request_id}: need a prompt and max_new_tokens >= 1")
        self._waiting[request_id] = _Request(request_id, list(prompt_token_ids), max_new_tokens,
                                             temperature, top_p)

    def running(self) -> list[int]:
        """Requests that have started decoding (their tokens so far were sampled)."""
        return [r.request_id for r in self._slots if r is not None]

    def unfinished(self) -> int:
        return len(self.running()) + len(self._waiting)

    last_step_rows: int = 0
    last_decode_shape: tuple[int, int] = (0, 0)
    """What the last step's decode pass computed: (rows: every used slot, free ones included,
    keys and values attended: those rows x the shared window). rlvr/plan/decode_probe.py fits
    the cost of a step on it."""
    prefix_cache_resets_refused: int = 0  # no prefix cache: never

    @property
    def max_rows(self) -> int:
        return self.max_batch

    @torch.inference_mode()  # frees slots: the cache's tensors are inference tensors
    def abort(self, request_ids: Iterable[int]) -> list[Aborted]:
        """Stop these requests now; returns what each had generated (unknown ids: ignored)."""
        ids = set(request_ids)
        out = [_aborted(r) for r in self._waiting.values() if r.request_id in ids]
        for a in out:
            del self._waiting[a.request_id]
        gone = [s for s, r in enumerate(self._slots) if r is not None and r.request_id in ids]
        out += [_aborted(self._slots[s]) for s in gone]
        self._free(gone)
        return out

    # -- decoding -----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, admit: bool = True) -> list[Finished]:
        """One decode step: a token for every running request, and (with `admit`) the first
        token of waiting requests that fit in `max_batch`. Returns the requests that finished."""
        live = [s for s, r in enumerate(self._slots) if r is not None]
        kv = self._kv
        self.last_decode_shape = (kv.used, kv.used * (kv.end - kv.lo + 1)) if live else (0, 0)
        if live:
            t0 = time.perf_counter()
            logits = self._kv.decode(self.model, self._last)               # (slots used, V)
            self._last[live] = self._sample_into([self._slots[s] for s in live], logits[live],
                                                 time.perf_counter() - t0)
        if admit and self._waiting and len(live) < self.max_batch:
            new = [self._waiting.popitem(last=False)[1]
                   for _ in range(min(len(self._waiting), self.max_batch - len(live)))]
            slots = self._kv.free_slots(len(new))
            t0 = time.perf_counter()
            logits = self._kv.add(self.model, [r.prompt for r in new], slots, self.pad_token_id)
            tokens = self._sample_into(new, logits, time.perf_counter() - t0)
            grown = self._kv.used - len(self._slots)
            self._slots += [None] * grown
            self._last = torch.cat([self._last, self._last.new_zeros(grown)])
            for r, s in zip(new, slots):
                self._slots[s] = r
            self._last[slots] = tokens
        self.last_step_rows = len(self.running())  # every one got a token
        return self._collect_finished()

    def _sample_into(self, rows: list[_Request], logits: torch.Tensor,
                     seconds: float) -> torch.Tensor:
        """Sample one token per row from `logits` (n, V), record it; returns the tokens (n,)."""
        temps = torch.tensor([r.temperature for r in rows], device=logits.device)
        top_ps = torch.tensor([r.top_p for r in rows], device=logits.device)
        tokens, logp = sample_tokens(logits, temps, top_ps)
        for r, tok, lp in zip(rows, tokens.tolist(), logp.tolist()):
            r.append(tok, lp, self.policy_version)
            r.compute_s += seconds / len(rows)
        return tokens

    def _collect_finished(self) -> list[Finished]:
        done, slots = [], []
        for s, r in enumerate(self._slots):
            if r is None:
                continue
            eos = r.tokens[-1] in self.eos_ids
            if eos or len(r.tokens) >= r.max_new_tokens:
                done.append(Finished(r.request_id, r.tokens, r.logprobs, r.version_runs,
                                     truncated=not eos, compute_s=r.compute_s))
                slots.append(s)
        self._free(slots)
        return done

    def _free(self, slots: list[int]) -> None:
        if not slots:
            return
        for s in slots:
            self._slots[s] = None
        self._kv.drop(slots)
        del self._slots[self._kv.used:]
        self._last = self._last[:self._kv.used]
        moved = self._kv.compact()  # half the slots free: the live ones move to the front
        if moved is not None:
            self._slots = [self._slots[s] for s in moved]
            self._last = self._last[moved]

    # -- weights ------------------------------------------------------------------------------
    def weight_targets(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.model.named_parameters())

    def commit_weights(self) -> None:
        pass  # the broadcast wrote straight into the parameters

    def generate(self, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[list[Completion]]:
        """n[i] completions of prompts[i], run to the end (evaluation, benchmarks), with the
        model in eval mode meanwhile: the learner's own module trains between evaluations."""
        was_training = self.model.training
        self.model.eval()
        try:
            return generate_all(self, prompts, n, max_new_tokens, temperature, top_p)
        finally:
            self.model.train(was_training)

    def close(self) -> None:
        pass  # nothing beyond memory


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor,
                  top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` (n, V) and its log-prob under softmax(logits / T).

    temperature (n,): 0 = greedy (log-prob then under the temperature-1 softmax). top_p (n,):
    nucleus sampling; the log-prob stays the pre-top-p one."""
    greedy = temperature <= 0
    scaled = logits.float() / torch.where(greedy, 1.0, temperature)[:, None]  # (n, V)
    logp_all = torch.log_softmax(scaled, dim=-1)                              # (n, V)
    if bool(greedy.all()):  # draws no random number: greedy rows leave the generator as it was
        tokens = logits.argmax(-1)
        return tokens, logp_all.gather(-1, tokens[:, None])[:, 0]
    weights = logp_all.exp()
    if bool((top_p < 1).any()):
        sorted_p, order = weights.sort(dim=-1, descending=True)
        # drop a token once the mass before it already reaches top_p (the first always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p[:, None]
        weights = weights.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    tokens = torch.multinomial(weights, 1)[:, 0]                               # (n,)
    tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, logp_all.gather(-1, tokens[:, None])[:, 0]


def _aborted(r: _Request) -> Aborted:
    return Aborted(r.request_id, len(r.tokens), r.compute_s, tuple(r.tokens), tuple(r.logprobs),
                   tuple(r.version_runs))
