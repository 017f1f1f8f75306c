"""GPU checks on one machine: generation, learner and weight-handover speed, and a short async run.

Why: the CPU test suite cannot say how fast the GPU path is, or whether it works at all. Each
section measures one thing on the GPU and records numbers, not pass/fail, in one JSON file:
  hf_generate      HF engine tokens/s: the tiny model (fp32) and a random-init ~1.5B Qwen2 (bf16)
  learner_step     DeepSpeed bf16 engine (ZeRO-2, one GPU): fwd+bwd+step tokens/s on the ~1.5B model
  weight_handover  protocol.weights (gloo, CPU hop: GPU -> CPU -> gloo -> CPU -> GPU) into the vLLM
                   engine's staging tensors, vs a device-to-device copy_ of the same bytes (one GPU
                   cannot hold two NCCL ranks)
  async_train      `rlvr train configs/tiny-cpu.yaml model.device=cuda run.steps=20 mode=async`
                   from a 60-step warm start (the async machinery on the device, not learning)
  vllm_engine      VLLMEngine on the tiny model, log-probs vs an HF forward, weights round trip
                   (only where vLLM is installed)
Each section runs in its own process with its own time budget, so a crash, an OOM or a hang in
one leaves the others' results; partial results of a section that runs out of time are kept.
Written to --out: gpu_check.json (everything) and gpu_check.md (a row per section: its status,
seconds and the numbers it measured), which is also printed.

    python scripts/gpu_check.py --out gpu_check_out            # all sections (scripts/gpu_check.sh)
    python scripts/gpu_check.py --out /tmp/x --dry-run          # same code on CPU, tiny sizes
                                                                # (tests/test_gpu_check.py, CI)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_sections import SECTIONS, interrupt_on_sigterm, run_bounded  # noqa: E402

BUDGETS_S = {"hf_generate": 90, "learner_step": 80, "weight_handover": 80, "async_train": 150,
             "vllm_engine": 70}
# -- driver ------------------------------------------------------------------------------------

def run_section(name: str, result_path: Path, workdir: Path, device: str, dry_run: bool,
                budget_s: float) -> None:
    """Child-process entry: run one section, saving its results after every measurement."""
    res = {"status": "running", "budget_s": budget_s}

    def save():
        result_path.write_text(json.dumps(res, indent=1, default=str))

    t0 = time.perf_counter()
    try:
        SECTIONS[name](res, save, workdir, device, dry_run)
        res.pop("phase", None)
        res["status"] = "skipped" if "skipped" in res else "ok"
    except KeyboardInterrupt:
        res["status"] = "interrupted"
    except Exception as e:  # noqa: BLE001 - recorded, the next section still runs
        res.update(status="failed", error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc()[-3000:])
    res["seconds"] = round(time.perf_counter() - t0, 1)
    save()


def environment() -> dict:
    env = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "deepspeed", "vllm", "msgspec", "zmq"):
        spec = importlib.util.find_spec(mod)
        env[mod] = None if spec is None else "installed"
    import torch
    env.update(torch=torch.__version__, cuda=torch.version.cuda,
               gpus=torch.cuda.device_count())  # no CUDA context in the driver process
    try:
        env["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        env["gpu"] = None
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu_check_out"))
    ap.add_argument("--budget-s", type=float,
                    help="whole run, all sections (default 420; with --dry-run 1200)")
    ap.add_argument("--only", nargs="*", choices=list(SECTIONS), help="run just these sections")
    ap.add_argument("--dry-run", action="store_true", help="CPU, toy sizes: checks the code only")
    ap.add_argument("--section", help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--section-budget-s", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    interrupt_on_sigterm()
    if args.section:
        run_section(args.section, Path(args.result), Path(args.workdir), device, args.dry_run,
                    args.section_budget_s)
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (args.budget_s or (1200.0 if args.dry_run else 420.0))
    report = {"environment": environment(), "dry_run": args.dry_run, "sections": {}}
    if not args.dry_run and not report["environment"]["gpus"]:
        print("no CUDA device visible; use --dry-run to check the code on CPU", file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    try:
        run_sections(args, report, out, workdir, deadline)
    except KeyboardInterrupt:
        report["interrupted"] = True
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    table = markdown_table(report)
    (out / "gpu_check.md").write_text(table)
    print(table, end="")
    sections = report["sections"].values()
    ok = all(s["status"] in ("ok", "skipped") for s in sections) and "interrupted" not in report
    return 0 if ok else 1


def markdown_table(report: dict) -> str:
    """gpu_check.md: a row per section, its status and seconds, and every number it measured
    (nested ones by their dotted path); the JSON beside it has the rest (logs, tracebacks)."""
    def numbers(value, path: str):
        if isinstance(value, dict):
            for key, inner in value.items():
                yield from numbers(inner, f"{path}.{key}" if path else key)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{path} {value:g}"

    env = report["environment"]
    lines = [f"GPU check{' (dry run, CPU)' if report['dry_run'] else ''}: gpu {env.get('gpu')}, "
             f"torch {env.get('torch')}, cuda {env.get('cuda')}", "",
             "| section | status | s | measured |", "|---|---|---|---|"]
    for name, res in report["sections"].items():
        measured = {k: v for k, v in res.items()  # a whole metrics row is the JSON's
                    if k not in ("budget_s", "seconds", "wall_s", "last_metrics")}
        why = res.get("error") or res.get("skipped") or res.get("reason") or ""
        cells = "; ".join(numbers(measured, "")) or why
        lines.append(f"| {name} | {res['status']} | {res.get('wall_s', '')} | {cells} |")
    return "\n".join(lines) + "\n"


def run_sections(args, report: dict, out: Path, workdir: Path, deadline: float) -> None:
    for name in args.only or SECTIONS:
        # the budgets are a GPU's; a dry run's sections run on a busy CPU (CI's other worker)
        budget = min(BUDGETS_S[name] * (3 if args.dry_run else 1), deadline - time.monotonic() - 5)
        if budget < 15:
            report["sections"][name] = {"status": "skipped", "reason": "out of time"}
            continue
        result = workdir / f"{name}.json"
        cmd = [sys.executable, __file__, "--section", name, "--result", str(result),
               "--workdir", str(workdir), "--section-budget-s", str(budget)]
        cmd += ["--dry-run"] if args.dry_run else []
        print(f"[gpu_check] {name} (budget {budget:.0f} s)", flush=True)
        t0 = time.perf_counter()
        interrupted = False
        try:
            rc, output = run_bounded(cmd, budget, grace_s=6.0)
        except KeyboardInterrupt:  # the section's group is already ended
            rc, output, interrupted = None, "", True
        res = json.loads(result.read_text()) if result.exists() else {"status": "failed"}
        if rc is None:
            res["status"] = "interrupted" if interrupted else "timeout"
        if res["status"] not in ("ok", "skipped"):
            res["log_tail"] = output[-2000:]
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        report["sections"][name] = res
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"[gpu_check] {name}: {res['status']} in {res['wall_s']} s", flush=True)
        if interrupted:
            raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
