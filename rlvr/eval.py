"""`rlvr eval`: held-out accuracy of a run's checkpoint or of any Hugging Face model folder.

    rlvr eval runs/demo [--step 200] [--samples 8] [--engine hf|vllm] [--out FILE] [a.b=value ...]
    rlvr eval /path/to/hf-model --config configs/tiny-cpu.yaml [--samples 8] [a.b=value ...]

A run folder (it has config.yaml) is evaluated at its newest complete checkpoint (`--step N`
for another), whose `hf/` folder loads with `from_pretrained`, on the run's own held-out set and
sampling settings: task, prompt template, max_new_tokens, temperature, eval_samples, all from its
config.yaml. Any other folder is a Hugging Face model (config.json) and needs `--config` for
those. Dotted overrides apply on top either way (`task.eval_per_level=256`).

The numbers are the ones the run logs (tasks/evaluation.py: the same function the learner calls
at each `run.eval_every`): eval/avg@k (mean accuracy of k samples per prompt), eval/pass@k,
eval/greedy, and each per level (`eval/avg@k/level2`, ...). They are printed and written as JSON
to `--out` (default: RUN_DIR/eval/step_<N>-<engine>-k<K>.json for a run,
runs/eval/<model folder name>-<engine>-k<K>.json for a model folder). Sampling is seeded with
run.seed.

Engines: `hf` (default; the decode loop of the actors and the learner, tasks/hf_engine.py) or
`vllm` (vLLM's offline `LLM` with the actors' request building, actors/engines/vllm.py; greedy is
temperature 0 there).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from learner.run_log import write_json_atomic


class EvalError(ValueError):
    """The folder or the arguments cannot be evaluated; the message says why."""


def resolve_target(path: str | Path, config: str | None, overrides: list[str],
                   step: int | None):
    """(model folder, Config, description, checkpoint step or None) for `path`."""
    from protocol.config import load_config

    path = Path(path)
    if not path.is_dir():
        raise EvalError(f"{path}: no such folder")
    if (path / "config.yaml").exists():
        from learner.checkpoint import latest_checkpoint

        if config:
            raise EvalError(f"{path} is a run folder: its own config.yaml is used (drop --config; "
                            "dotted overrides still apply)")
        cfg = load_config(path / "config.yaml", overrides, run_folder=True)
        if step is None:
            ckpt = latest_checkpoint(path)
            if ckpt is None:
                raise EvalError(f"{path}: no complete checkpoint in {path / 'checkpoints'}")
        else:
            ckpt = path / "checkpoints" / f"step_{step:06d}"
            if not (ckpt / "COMPLETE").exists():
                raise EvalError(f"{ckpt}: not a complete checkpoint")
        model_dir = ckpt / "hf"
        ckpt_step = int(ckpt.name.split("_")[1])
        return model_dir, cfg, f"{path} checkpoint step {ckpt_step}", ckpt_step
    if not (path / "config.json").exists():
        raise EvalError(f"{path}: neither a run folder (config.yaml) nor a Hugging Face model "
                        "folder (config.json)")
    if not config:
        raise EvalError(f"{path} is a model folder: give --config CONFIG for the task, prompt "
                        "template and sampling settings")
    return path, load_config(config, overrides), f"model {path}", None


class VLLMSampler:
    """vLLM's offline engine behind the `generate` signature evaluation uses (greedy included)."""

    def __init__(self, model_dir: str, cfg):
        from actors.engines.vllm import engine_kwargs
        from actors.engines.vllm_requests import completion_from_output

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        on_cpu = not cfg.model.device.startswith("cuda")
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        import vllm

        from transformers import GenerationConfig

        kw = engine_kwargs(model_dir, cfg.model.dtype, cfg.actors.gpu_memory_utilization,
                           cfg.actors.enable_prefix_caching,
                           cfg.actors.max_model_len,
                           cfg.run.seed, cfg.actors.enforce_eager or on_cpu)
        self._llm = vllm.LLM(**kw)
        self._params = vllm.SamplingParams
        self._completion = completion_from_output
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        self.eos = [eos] if isinstance(eos, int) else list(eos)

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, top_p=1.0):
        params = [self._params(n=k, temperature=temperature,
                               top_p=top_p if temperature > 0 else 1.0, top_k=-1,
                               max_tokens=max_new_tokens, logprobs=0, detokenize=False,
                               stop_token_ids=self.eos) for k in n]
        results = self._llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                     use_tqdm=False)
        return [[self._completion(c.token_ids, c.logprobs, self.eos, max_new_tokens)
                 for c in r.outputs] for r in results]


def make_sampler(engine: str, model_dir: Path, cfg):
    match engine:
        case "hf":
            import torch
            from transformers import AutoModelForCausalLM

            from tasks.hf_engine import HFEngine

            torch.set_num_threads(cfg.actors.threads)  # as the run samples (an actor's threads)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(
                torch, cfg.model.dtype)).to(cfg.model.device)
            return HFEngine(model, cfg.actors.max_batch)
        case "vllm":
            try:
                return VLLMSampler(str(model_dir), cfg)
            except ImportError as e:
                raise EvalError(f"--engine vllm: vLLM is not installed ({e})") from e
        case _:
            raise EvalError(f"--engine {engine!r}: choose hf or vllm")


def evaluate_folder(path: str | Path, config: str | None = None, overrides: list[str] = (),
                    samples: int | None = None, engine: str = "hf", step: int | None = None,
                    out: str | Path | None = None) -> dict:
    """Evaluate and write the metrics; returns {"metrics", "out", ...}."""
    from tasks.tiny_model import load_tokenizer

    from learner.data import held_out
    from tasks.evaluation import evaluate
    from tasks.verifier import Verifier

    overrides = list(overrides) + ([f"task.eval_samples={samples}"] if samples else [])
    model_dir, cfg, what, ckpt_step = resolve_target(path, config, overrides, step)
    k = cfg.task.eval_samples
    if k < 1:
        raise EvalError(f"--samples / task.eval_samples must be >= 1, got {k}")
    tokenizer = load_tokenizer(model_dir)
    t0 = time.time()
    sampler = make_sampler(engine, model_dir, cfg)
    load_s = time.time() - t0
    problems = held_out(cfg)
    verifier = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)
    try:
        metrics = evaluate(sampler, tokenizer, problems, verifier, k, cfg.rollout.max_new_tokens,
                           cfg.rollout.temperature, cfg.task.prompt_template, seed=cfg.run.seed)
    finally:
        verifier.close()
    if out is None:
        name = f"{'step_%06d' % ckpt_step if ckpt_step is not None else Path(path).name}"
        base = Path(path) / "eval" if ckpt_step is not None else Path("runs") / "eval"
        out = base / f"{name}-{engine}-k{k}.json"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"evaluated": what, "model_dir": str(model_dir), "step": ckpt_step,
              "engine": engine, "samples": k, "prompts": len(problems),
              "max_new_tokens": cfg.rollout.max_new_tokens,
              "temperature": cfg.rollout.temperature, "seed": cfg.run.seed,
              "load_s": load_s, "metrics": metrics}
    write_json_atomic(out, result)
    result["out"] = str(out)
    return result


def report(result: dict) -> str:
    m, k = result["metrics"], result["samples"]
    levels = sorted({key.rsplit("/level", 1)[1] for key in m if "/level" in key}, key=int)
    lines = [f"{result['evaluated']} ({result['engine']}, {result['prompts']} prompts, "
             f"{k} samples each, {m.get('timing/eval', 0):.1f} s)",
             "| level | avg@%d | pass@%d | greedy |" % (k, k), "|---|---:|---:|---:|"]

    def cell(key):
        v = m.get(key)
        return "-" if v is None else f"{v:.3f}"
    for lv in levels:
        lines.append(f"| {lv} | {cell(f'eval/avg@{k}/level{lv}')} | {cell(f'eval/pass@{k}/level{lv}')} | "
                     f"{cell(f'eval/greedy/level{lv}')} |")
    lines.append(f"| all | {cell(f'eval/avg@{k}')} | "
                 f"{cell(f'eval/pass@{k}')} | {cell('eval/greedy')} |")
    return "\n".join(lines)


def run(args) -> int:
    try:
        result = evaluate_folder(args.path, args.config, args.overrides, args.samples,
                                 args.engine, args.step, args.out)
    except EvalError as e:
        print(f"rlvr eval: {e}", file=sys.stderr)
        return 2
    print(report(result))
    print(json.dumps(result["metrics"], indent=None))
    print(f"written: {result['out']}")
    return 0


def add_cli(sub) -> None:
    e = sub.add_parser("eval", help="held-out accuracy of a run's checkpoint or a model folder")
    e.add_argument("path", help="run folder (newest checkpoint) or Hugging Face model folder")
    e.add_argument("overrides", nargs="*", help="dotted overrides a.b=value")
    e.add_argument("--config", help="config for a model folder (task, template, sampling)")
    e.add_argument("--samples", type=int, help="samples per prompt k (task.eval_samples)")
    e.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    e.add_argument("--step", type=int, help="a run's checkpoint step (default: the newest)")
    e.add_argument("--out", help="JSON file for the metrics")
    e.set_defaults(func=run)
