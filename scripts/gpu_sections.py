"""The sections of scripts/gpu_check.py (see its docstring), each run in a child process of its
own: `SECTIONS[name](res, save, workdir, device, dry_run)` fills `res` and calls `save()` after
every measurement, so a section cut short by its budget keeps what it measured."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlvr.launch import free_port  # noqa: E402  (after ROOT is on the path: run as a script)

H200_BF16_TFLOPS = 989.0  # dense peak, for a rough MFU


def large_config(dry_run: bool):
    """Qwen2.5-1.5B's shapes (1.54B parameters, tied embeddings), or a toy for --dry-run."""
    from transformers import Qwen2Config
    shape = (dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2) if dry_run else
             dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2))
    return Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True,
                       rope_theta=1e6, pad_token_id=0, eos_token_id=1, bos_token_id=None)


def build_large(device: str, dry_run: bool, dtype=None):
    import torch
    from transformers import Qwen2ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the GPU: seconds instead of minutes on CPU
        model = Qwen2ForCausalLM(large_config(dry_run))
    return model.to(dtype or torch.bfloat16)


def sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_bounded(cmd: list[str], timeout_s: float, grace_s: float = 2.0,
                **kw) -> tuple[int | None, str]:
    """Run `cmd` in a process group of its own and end that whole group afterwards (SIGTERM,
    then SIGKILL after `grace_s`), also on time-out or interruption: sections and `rlvr train`
    start learner and actor processes that must not outlive the check.
    Returns (exit status, None on time-out; combined output)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)
    out, rc = None, None
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            if sig == signal.SIGTERM:
                try:
                    proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
                time.sleep(min(grace_s, 0.5))  # the rest of the group may still be exiting
    if out is None:
        out, _ = proc.communicate()
    return rc, out


def interrupt_on_sigterm() -> None:
    """SIGTERM (from `timeout` or a parent giving up) unwinds like Ctrl-C, so `run_bounded`'s
    clean-up runs and the results so far are written."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)


# -- sections: each fills `res` (a dict saved after every measurement) -------------------------

def hf_generate(res, save, workdir: Path, device: str, dry_run: bool) -> None:
    import torch
    from actors.engines.factory import make_engine
    from tasks.tiny_model import build_tiny

    def measure(engine, vocab, prompts, n, prompt_len, new_tokens):
        g = torch.Generator().manual_seed(0)
        batch = [torch.randint(5, vocab, (prompt_len,), generator=g).tolist()
                 for _ in range(prompts)]
        engine.generate(batch[:2], [1, 1], max_new_tokens=new_tokens)  # warm-up, full length
        sync(device)
        t0 = time.perf_counter()
        out = engine.generate(batch, [n] * prompts, max_new_tokens=new_tokens)
        sync(device)
        dt = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for group in out for c in group)
        return dict(sequences=prompts * n, prompt_len=prompt_len, max_new_tokens=new_tokens,
                    tokens=tokens, seconds=round(dt, 3), tokens_per_s=round(tokens / dt, 1))

    res["phase"] = "tiny"
    save()
    tiny = build_tiny(workdir / "tiny")
    engine = make_engine("hf", str(tiny), device=device, dtype="float32")
    res["tiny_fp32"] = measure(engine, 100, 64, 8, 16, 64)
    save()
    del engine
    res["phase"] = "large"
    save()
    large_dir = workdir / "large"
    model = build_large(device, dry_run)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 1
    model.save_pretrained(large_dir)
    res["large_params"] = sum(p.numel() for p in model.parameters())
    del model
    engine = make_engine("hf", str(large_dir), device=device, dtype="bfloat16")
    prompts, n, new = (4, 2, 16) if dry_run else (32, 2, 256)
    res["large_bf16"] = measure(engine, 1000, prompts, n, 128, new)
    save()
    # The same batch through model.generate without the engine's per-step logits: the gap is
    # the cost of HFEngine's log-prob extraction (a (B, T, V) float tensor on the CPU).
    ids = torch.randint(5, 1000, (prompts * n, 128), device=device)
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        gen = engine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                    do_sample=True, top_k=None, max_new_tokens=new,
                                    min_new_tokens=new, pad_token_id=0, eos_token_id=1)
    sync(device)
    dt = time.perf_counter() - t0
    tokens = (gen.shape[1] - 128) * gen.shape[0]
    res["large_bf16_raw_generate"] = dict(tokens=tokens, seconds=round(dt, 3),
                                          tokens_per_s=round(tokens / dt, 1))


def learner_step(res, save, workdir: Path, device: str, dry_run: bool) -> None:
    import deepspeed
    import torch
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                      LOCAL_RANK="0", WORLD_SIZE="1")
    res["phase"] = "init_distributed"
    save()
    deepspeed.init_distributed(dist_backend="nccl" if device.startswith("cuda") else "gloo")
    micro, seq = (2, 64) if dry_run else (8, 1024)
    zero = 2
    model = build_large(device, dry_run, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    ds_config = {
        "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True}, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": zero},
        # torch's AdamW: no fused-Adam kernel to compile on a machine without a package index
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-6, "torch_adam": True}},
    }
    res["phase"] = "deepspeed.initialize"
    save()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config)
    res.update(params=n_params, zero_stage=zero, micro_batch=micro, seq_len=seq, phase="steps")
    save()
    ids = torch.randint(5, model.config.vocab_size, (micro, seq), device=engine.device)
    times = []
    for step in range(2 + 5):  # 2 warm-up steps
        sync(device)
        t0 = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        sync(device)
        if step >= 2:
            times.append(time.perf_counter() - t0)
            step_s = sorted(times)[len(times) // 2]
            res.update(step_s_median=round(step_s, 4), tokens_per_s=round(micro * seq / step_s, 1),
                       mfu_approx=round(6 * n_params * micro * seq / step_s / 1e12
                                        / H200_BF16_TFLOPS, 3), loss=float(loss))
            if device.startswith("cuda"):
                res["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            save()


def _handover_actor(port: int, cfg_dir: str, device: str, rounds: list, queue) -> None:
    """Rank 1: the vLLM engine's staging tensors, filled through protocol.weights."""
    import torch
    from actors.engines.vllm import allocate_staging, staging_specs
    from protocol.weights import WeightGroup
    try:
        staging = allocate_staging(staging_specs(cfg_dir)[0], torch.bfloat16, device)
        times = []
        with WeightGroup.create("127.0.0.1", port, 1, 2, timeout_s=60) as group:
            for bucket_bytes in rounds:
                sync(device)
                t0 = time.perf_counter()
                group.receive(staging, bucket_bytes=bucket_bytes)
                sync(device)
                times.append(time.perf_counter() - t0)
        queue.put(("ok", times, [float(t.double().sum()) for _, t in staging]))
    except Exception:  # noqa: BLE001 - reported by the parent
        queue.put(("error", traceback.format_exc(), None))


def weight_handover(res, save, workdir: Path, device: str, dry_run: bool) -> None:
    import multiprocessing as mp
    import torch
    from protocol.weights import WeightGroup

    model = build_large(device, dry_run)
    cfg_dir = workdir / "large_config"
    model.config.save_pretrained(cfg_dir)
    params = [(n, p.detach()) for n, p in model.named_parameters()]
    nbytes = sum(p.numel() * p.element_size() for _, p in params)
    res.update(tensors=len(params), gbytes=round(nbytes / 1e9, 3))
    rounds = [64 << 20] * 3 + [256 << 20] * 3  # first of each size warms up
    port, queue = free_port(), mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=_handover_actor,
                                            args=(port, str(cfg_dir), device, rounds, queue))
    child.start()
    res["phase"] = "broadcasts"
    save()
    send_times = []
    with WeightGroup.create("127.0.0.1", port, 0, 2, timeout_s=60) as group:
        for bucket_bytes in rounds:
            sync(device)
            t0 = time.perf_counter()
            group.send(params, bucket_bytes=bucket_bytes)
            send_times.append(time.perf_counter() - t0)
        status, recv_times, sums = queue.get(timeout=120)
    child.join(timeout=30)
    if status != "ok":
        raise RuntimeError(f"actor process failed:\n{recv_times}")
    mine = [float(p.double().sum()) for _, p in params]
    res["received_equal"] = all(abs(a - b) <= 1e-9 * max(1.0, abs(a)) for a, b in zip(mine, sums))
    for name, lo in (("bucket_64mb", 0), ("bucket_256mb", 3)):
        best = min(recv_times[lo + 1:lo + 3])  # receiver's wall time covers the whole handover
        res[f"gloo_cpu_hop_{name}"] = dict(
            seconds=round(best, 4), gb_per_s=round(nbytes / best / 1e9, 2),
            sender_seconds=round(min(send_times[lo + 1:lo + 3]), 4))
    save()
    dst = [torch.empty_like(p) for _, p in params]
    times = []
    for _ in range(3):
        sync(device)
        t0 = time.perf_counter()
        for d, (_, s) in zip(dst, params):
            d.copy_(s)
        sync(device)
        times.append(time.perf_counter() - t0)
    best = min(times[1:])
    res["d2d_copy_per_tensor"] = dict(seconds=round(best, 5),
                                      gb_per_s=round(nbytes / best / 1e9, 1))


def async_train(res, save, workdir: Path, device: str, dry_run: bool) -> None:
    cfg = ROOT / "configs" / "tiny-cpu.yaml"
    out_dir = workdir / "runs"
    # gloo weight sync: NCCL cannot put the learner and the actor on the same GPU. A 60-step
    # warm start (the suite's): the run checks the async machinery on the device, not learning.
    # GPU_CHECK_WARM_CACHE: a cache that may hold it already (the suite's, in its dry run)
    cache = os.environ.get("GPU_CHECK_WARM_CACHE") or workdir / "warm"
    argv = ["rlvr", "train", str(cfg), f"model.device={device}",
            f"run.steps={3 if dry_run else 20}", "mode=async", "weight_sync.backend=gloo",
            "warm_start.steps=60", f"warm_start.cache_dir={cache}",
            f"run.out_dir={out_dir}", "run.name=gpu-check", "run.wandb=disabled",
            "run.progress=false"]
    code = f"import sys; sys.argv = {argv!r}; from rlvr.cli import main; sys.exit(main())"
    t0 = time.perf_counter()
    rc, output = run_bounded([sys.executable, "-c", code], max(10, res["budget_s"] - 10), cwd=ROOT)
    res.update(rc=rc, seconds=round(time.perf_counter() - t0, 1), output_tail=output[-3000:])
    metrics = sorted(out_dir.glob("*/metrics.jsonl"))
    if metrics:
        lines = metrics[0].read_text().splitlines()
        res.update(metric_lines=len(lines), last_metrics=json.loads(lines[-1]) if lines else None)
    if rc != 0:
        why = "ran out of time" if rc is None else f"exited with {rc}"
        raise RuntimeError(f"rlvr train {why}")


def vllm_engine(res, save, workdir: Path, device: str, dry_run: bool) -> None:
    if importlib.util.find_spec("vllm") is None:
        res["skipped"] = ("vllm is not installed: `make install` installs it where the package "
                          "index is reachable; its wheel is larger than a device run can carry")
        return
    import torch
    from transformers import AutoModelForCausalLM
    from actors.engines.vllm import VLLMEngine
    from tasks.tiny_model import build_model, build_tiny, build_tokenizer

    tiny = build_tiny(workdir / "tiny_vllm")
    engine = VLLMEngine(str(tiny), device=device, gpu_memory_utilization=0.3, max_model_len=256,
                        enforce_eager=True, kv_cache_gib=1 if device == "cpu" else None)
    prompts = [[5 + (7 * i + j) % 90 for j in range(12)] for i in range(8 if dry_run else 64)]
    new_tokens = 16 if dry_run else 48

    def gap_to(model, temperature=0.7):
        """Largest |vLLM log-prob - HF log-prob| of the sampled tokens, at this temperature."""
        t0 = time.perf_counter()
        out = engine.generate(prompts, [8] * len(prompts), new_tokens, temperature=temperature)
        dt = time.perf_counter() - t0
        gap = 0.0
        with torch.no_grad():
            for prompt, group in zip(prompts, out):
                for c in group[:2]:
                    ids = torch.tensor([prompt + c.token_ids], device=device)
                    logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
                    ref = logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None])[:, 0]
                    mine = torch.tensor(c.logprobs, device=device)
                    gap = max(gap, (ref - mine).abs().max().item())
        tokens = sum(len(c.token_ids) for g in out for c in g)
        return gap, tokens / dt

    model_a = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16).to(device)
    gap_a, tps = gap_to(model_a)
    res.update(tokens_per_s=round(tps, 1), logprob_gap_vs_hf=gap_a)
    save()
    model_b = build_model(build_tokenizer(), seed=1).to(device, torch.bfloat16)
    for (_, target), (_, p) in zip(engine.weight_targets(), model_b.named_parameters()):
        target.copy_(p)
    t0 = time.perf_counter()
    engine.commit_weights()
    res["commit_s"] = round(time.perf_counter() - t0, 4)
    res["after_commit_gap_vs_new"], _ = gap_to(model_b)
    res["after_commit_gap_vs_old"], _ = gap_to(model_a)  # should be large: old weights are gone


SECTIONS = {"hf_generate": hf_generate, "learner_step": learner_step,
            "weight_handover": weight_handover, "async_train": async_train,
            "vllm_engine": vllm_engine}
