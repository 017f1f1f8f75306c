"""`rlvr export RUN OUT`: a run's trained policy as a folder of its own, for use outside rlvr.

    rlvr export runs/demo out/demo-model                 # a Hugging Face model folder
    rlvr export runs/lora out/lora-adapter [--step 200]  # a LoRA run: its PEFT adapter folder
    rlvr export runs/lora out/lora-model --merge         # a LoRA run: base + adapter, merged

What: the newest complete checkpoint (or `--step`'s) of the run folder RUN. A full run's policy
is its checkpoint's hf/ (weights, config and tokenizer), copied to OUT. A LoRA run's checkpoint
holds both: hf/ with the adapter merged into its base (learner/lora.py, what the actors
receive), which `--merge` writes, and adapter/, which OUT gets as a PEFT adapter folder
(adapter_model.safetensors, adapter_config.json naming the base model.path) that
`peft.PeftModel.from_pretrained(base, OUT)` loads. Both load with `from_pretrained`, in
transformers and in vLLM (the adapter through its LoRA requests). OUT must not exist yet.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


class ExportError(Exception):
    """The run folder or the arguments cannot be exported; the message says why."""


def export(run: str | Path, out: str | Path, merge: bool = False, step: int | None = None
           ) -> Path:
    """Write RUN's policy to OUT (see the module's docstring); returns OUT."""
    from rlvr.eval import EvalError, resolve_target

    run, out = Path(run), Path(out)
    if not (run / "config.yaml").exists():
        raise ExportError(f"{run}: not a run folder (no config.yaml)")
    if out.exists():
        raise ExportError(f"{out} exists: export writes a new folder")
    try:
        model_dir, cfg, _, _ = resolve_target(run, None, [], step)
    except EvalError as e:
        raise ExportError(str(e)) from e
    lora = cfg.model.lora
    if merge and not lora.rank:
        raise ExportError(f"--merge: {run} trained every weight (model.lora.rank 0), there is no "
                          "adapter to merge: drop --merge")
    if lora.rank and not merge:
        _write_peft_adapter(model_dir.parent / "adapter", lora, out)
    else:
        shutil.copytree(model_dir, out)
    return out


def _write_peft_adapter(adapter: Path, lora, out: Path) -> None:
    """A checkpoint's adapter/ as PEFT's own adapter folder."""
    from learner.lora import peft_config

    try:
        base = json.loads((adapter / "base.json").read_text())["path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{adapter / 'base.json'}: not a LoRA checkpoint's adapter ({e!r})")
    if not (adapter / "adapter.safetensors").exists():
        raise ExportError(f"{adapter}: no adapter.safetensors")
    out.mkdir(parents=True)
    peft_config(lora, base_model_name_or_path=base, task_type="CAUSAL_LM").save_pretrained(out)
    # get_peft_model_state_dict's keys (learner/lora.py) are PEFT's saved names already
    shutil.copyfile(adapter / "adapter.safetensors", out / "adapter_model.safetensors")


def run(args) -> int:
    try:
        out = export(args.run, args.out, args.merge, args.step)
    except ExportError as e:
        print(f"rlvr export: {e}", file=sys.stderr)
        return 2
    print(f"written: {out}")
    return 0


def add_cli(sub) -> None:
    e = sub.add_parser("export", help="a run's policy as a Hugging Face model or PEFT adapter")
    e.add_argument("run", help="run folder (its newest checkpoint)")
    e.add_argument("out", help="folder to write (must not exist)")
    e.add_argument("--merge", action="store_true",
                   help="a LoRA run: its adapter merged into the base, as whole weights")
    e.add_argument("--step", type=int, help="the checkpoint step (default: the newest)")
    e.set_defaults(func=run)
