"""`rlvr bench memory`: peak learner memory of one micro-batch, full logits against chunked.

    rlvr bench memory [--tokens 1024,4096,8192] [--seq-len 1024] [--vocab 151936]
                      [--hidden 256] [--layers 2] [--chunk-mb 128] [--out DIR]

One micro-batch of T tokens (T / seq-len rows of seq-len tokens, a 64-token prompt each) runs
forward and backward through a randomly initialised Qwen2 with Qwen2.5's 151,936-token
vocabulary (tied embeddings; hidden size and layers small so it runs on a laptop), float32 as
the learner on CPU, one thread. Variants, each measured side by side in the same run:
  full        the learner before chunking: the whole micro-batch's float32 logits, their
              log-softmax, and the entropy metric computed from them (learner.logprobs.
              full_logits_logp + entropy_from_logits);
  chunked     learner.logprobs.token_logp: LM head and log-softmax on chunks of the loss
              positions (--chunk-mb of float32 logits each, the learner's CHUNK_LOGITS_BYTES by
              default), each recomputed in the backward (activation checkpointing);
  no_recomp   the same chunks without recomputation (every chunk's logits kept for backward);
  body        the model body alone (loss on its final hidden states): what every variant pays
              before the LM head. A variant's head share = its peak - body's peak.
How peak memory is measured: every measurement runs in a fresh child process, forked from a
forkserver that has imported torch and transformers and allocated nothing else (so no tensor
memory is shared or cached from the parent, and the 8 children of a run do not pay 8 imports of
torch), with glibc's MALLOC_MMAP_THRESHOLD_=65536 (set before the server starts) so
that every tensor buffer is its own mapping, returned to the system when freed (RSS then follows
live tensors). After building the model and the batch, the child resets the kernel's peak-RSS
mark (writing 5 to /proc/self/clear_refs) and reads RSS; after forward + backward it reads the
peak (VmHWM in /proc/self/status). Peak = VmHWM - RSS before: activations, logits, gradients.
(tracemalloc does not see torch's allocations; where clear_refs cannot be written, the bench
stops.) A measurement that would not fit in the memory available now (estimated from T x V) is
left out and marked, never swapped into.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

from rlvr.bench.common import (BenchError, machine, markdown_table, names, targets_table,
                               write_results)
from rlvr.bench.run_metrics import ratio
from rlvr.bench.targets import target

VARIANTS = ("body", "full", "chunked", "no_recomp")
# what a child imports, imported once in the forkserver
PRELOAD = ["torch", "transformers.models.qwen2.modeling_qwen2", "learner.batch",
           "learner.logprobs", "learner.losses"]
PROMPT = 64
MB = 2**20


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise BenchError(f"/proc/self/status has no {key}")


def _child(variant: str, tokens: int, seq_len: int, vocab: int, hidden: int, layers: int,
           chunk_mb: int, results) -> None:
    """One measurement in a fresh process: bytes of peak memory over forward + backward."""
    try:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from learner.batch import Row, pack
        from learner.logprobs import final_hidden, full_logits_logp, token_logp
        from learner.losses import entropy_from_logits

        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=seq_len, tie_word_embeddings=True,
            attn_implementation="sdpa"))
        g = torch.Generator().manual_seed(1)
        rows = [Row(torch.randint(5, vocab, (PROMPT,), generator=g).tolist(),
                    torch.randint(5, vocab, (seq_len - PROMPT,), generator=g).tolist(),
                    [0.0] * (seq_len - PROMPT), 1.0, 0) for _ in range(tokens // seq_len)]
        packed = pack(rows, 0)
        m = packed.mask
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark
        before = _status_kb("VmRSS")
        match variant:
            case "body":
                h = final_hidden(model, packed)[:, :-1]
                loss = (h * m[..., None]).sum()
            case "full":
                logp, logits = full_logits_logp(model, packed)
                entropy = entropy_from_logits(logits.detach())  # the policy/entropy metric
                loss = -(logp * m).sum() / m.sum() + 0 * (entropy * m).sum()
            case "chunked" | "no_recomp":
                logp, entropy = token_logp(model, packed, entropy=True,
                                           chunk=max(1, (chunk_mb * MB) // (4 * vocab)),
                                           recompute=variant == "chunked")
                loss = -(logp * m).sum() / m.sum() + 0 * (entropy * m).sum()
        loss.backward()
        results.put(("ok", (_status_kb("VmHWM") - before) * 1024))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        results.put(("error", repr(e)))


def measure(variant: str, tokens: int, seq_len: int, vocab: int, hidden: int, layers: int,
            chunk_mb: int) -> int:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server starts (first child)
    results = ctx.Queue()
    old = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by the child's glibc at start-up
    try:
        proc = ctx.Process(target=_child, args=(variant, tokens, seq_len, vocab, hidden, layers,
                                                chunk_mb, results))
        proc.start()
    finally:
        if old is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_")
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = old
    try:
        status, value = results.get(timeout=1800)
    finally:
        proc.join(60)
    if status != "ok":
        raise BenchError(f"{variant} at {tokens} tokens failed: {value}")
    return value


def estimate_bytes(variant: str, tokens: int, vocab: int, hidden: int) -> int:
    """A guess of a measurement's peak, to leave out what cannot fit now (measured at 1k and 2k
    tokens: full 6.1 T x V float32 buffers: logits, log-softmax, the entropy's log-softmax,
    probabilities and product; no-recompute about 1.3 of them; chunked a constant)."""
    logits = 4 * tokens * vocab
    body = 64 * tokens * hidden * 4 + 8 * vocab * hidden
    match variant:
        case "full":
            return int(6.3 * logits) + body
        case "no_recomp":
            return 2 * logits + body + (1 << 30)
        case _:
            return body + (1 << 30)


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def run(out_dir: Path, tokens: list[int], seq_len: int, vocab: int, hidden: int, layers: int,
        chunk_mb: int) -> dict:
    if not os.access("/proc/self/clear_refs", os.W_OK):
        raise BenchError("cannot reset the peak-RSS mark (/proc/self/clear_refs): this bench "
                         "needs Linux")
    cases: dict[int, dict] = {}
    for t in tokens:
        if t % seq_len:
            raise BenchError(f"--tokens {t} is not a multiple of --seq-len {seq_len}")
        case: dict = {"logits_mb": 4 * t * vocab / MB}
        for v in VARIANTS:
            need, free = estimate_bytes(v, t, vocab, hidden), _available_bytes()
            if need > 0.8 * free:
                case[v] = None
                case.setdefault("left_out", {})[v] = (f"needs about {need / 2**30:.1f} GB, "
                                                      f"{free / 2**30:.1f} GB available")
                print(f"bench memory: {v} at {t} tokens left out ({case['left_out'][v]})",
                      flush=True)
                continue
            print(f"bench memory: {v} at {t} tokens", flush=True)
            case[v] = measure(v, t, seq_len, vocab, hidden, layers, chunk_mb) / MB
        for v in ("full", "chunked", "no_recomp"):
            case[f"head_{v}_mb"] = (None if case[v] is None or case["body"] is None
                                    else case[v] - case["body"])
        case["full_over_chunked"] = ratio(case["full"], case["chunked"])
        cases[t] = case
    lo, hi = min(tokens), max(tokens)
    full_at = max((t for t in tokens if cases[t]["full"] is not None), default=None)
    results = {
        "bench": "memory", "vocab": vocab, "hidden": hidden, "layers": layers,
        "seq_len": seq_len, "chunk_mb": chunk_mb, "dtype": "float32", "threads": 1,
        "peak_method": "VmHWM - VmRSS after clear_refs=5, fresh child forked from a forkserver "
                       "that imported the modules only, MALLOC_MMAP_THRESHOLD_=65536",
        "cases": cases, "machine": machine(),
        "targets": {
            "chunked_head_flat": target(
                f"chunked head share at {hi} / at {lo} tokens <= 2 ({hi // lo}x the tokens)",
                ratio(cases[hi]["head_chunked_mb"], cases[lo]["head_chunked_mb"]), "<=", 2.0),
            "full_over_chunked": target(
                f"full / chunked peak at {full_at} tokens >= 2",
                cases[full_at]["full_over_chunked"] if full_at else None, ">=", 2.0)},
    }
    write_results(out_dir, results)
    print(report(results))
    print(f"results: {out_dir / 'results.json'}")
    return results


def report(results: dict) -> str:
    rows = []
    for t, c in results["cases"].items():
        rows.append([str(t), c["logits_mb"], c["body"], c["full"], c["chunked"], c["no_recomp"],
                     c["head_full_mb"], c["head_chunked_mb"], c["full_over_chunked"]])
    table = markdown_table(
        ["tokens", "T x V fp32 MB", "body MB", "full MB", "chunked MB", "no-recompute MB",
         "head share full MB", "head share chunked MB", "full / chunked"], rows)
    left = [f"- {t} tokens, {v}: not measured, {why}" for t, c in results["cases"].items()
            for v, why in c.get("left_out", {}).items()]
    return (f"peak memory of one micro-batch (forward + backward), vocab {results['vocab']}, "
            f"hidden {results['hidden']}, {results['layers']} layers, chunks of "
            f"{results['chunk_mb']} MB of logits, float32, 1 thread\n\n"
            + table + ("\n" + "\n".join(left) + "\n" if left else "") + "\n"
            + targets_table(results["targets"]))


# ---- the command line: `rlvr bench memory` (rlvr/bench/cli.py lists this module) ----

HELP = "peak learner memory of one micro-batch: full logits vs chunked log-probs"
NEEDS_CONFIG = None  # no config and no run: one micro-batch of a model it builds


def add_arguments(p) -> None:
    p.add_argument("--tokens", default="1024,4096,8192",
                   help="micro-batch sizes in tokens, comma-separated")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per row")
    p.add_argument("--vocab", type=int, default=151_936, help="vocabulary (Qwen2.5's)")
    p.add_argument("--hidden", type=int, default=256, help="hidden size")
    p.add_argument("--layers", type=int, default=2, help="transformer layers")
    p.add_argument("--chunk-mb", type=int, default=None,
                   help="float32 logits per chunk in MB (default: the learner's)")


def check(args) -> str | None:
    tokens = names(args.tokens)
    if not tokens or not all(t.isdigit() and int(t) > 0 for t in tokens):
        return f"--tokens: positive whole numbers, comma-separated, not {args.tokens!r}"
    if args.seq_len <= 64 or any(int(t) % args.seq_len for t in tokens):
        return "--seq-len must exceed the 64-token prompt and divide every --tokens value"
    chunk_mb = 1 if args.chunk_mb is None else args.chunk_mb  # None: the learner's
    if min(args.vocab, args.hidden, args.layers, chunk_mb) < 1:
        return "--vocab, --hidden, --layers and --chunk-mb must be >= 1"
    return None


def main(args, out: Path, overrides: list[str]) -> None:
    from learner.logprobs import CHUNK_LOGITS_BYTES

    chunk_mb = args.chunk_mb if args.chunk_mb is not None else CHUNK_LOGITS_BYTES >> 20
    run(out, [int(t) for t in names(args.tokens)], args.seq_len, args.vocab, args.hidden,
        args.layers, chunk_mb)
