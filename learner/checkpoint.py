"""Checkpoints of the learner: a DeepSpeed engine wrapping a Hugging Face causal LM.

What: `save_checkpoint` writes `run_dir/checkpoints/step_000123/`:
    hf/            model + tokenizer via `save_pretrained` (safetensors): loadable with
                   `AutoModelForCausalLM.from_pretrained` and by vLLM, with no DeepSpeed around;
                   under model.lora the whole weights with the adapter merged in
    adapter/       under model.lora: the adapter's tensors (adapter.safetensors) and the base
                   they were trained on (base.json: model.path and the sha256 of its weights),
                   what a resume loads onto model.path's base
    optimizer.pt   optimizer + lr-scheduler state + engine step counters, when the engine's
                   optimizer is a plain torch optimizer (ZeRO stage 0, fp32: the CPU default)
    ds/            DeepSpeed's own `engine.save_checkpoint`, when DeepSpeed wraps the optimizer
                   (ZeRO >= 1, or fp16/bf16 mixed precision at stage 0): instead of optimizer.pt
    state.json     the caller's run state (step, policy_version, data position, RNG, reuse
                   buffer, statistics): plain JSON, no pickle
    COMPLETE       sha256 of state.json, written last
`latest_checkpoint` finds the newest complete one (skipping partial or corrupt ones with a
warning); `load_checkpoint` restores weights, optimizer and scheduler and returns the run state.

Why two optimizer formats: a plain torch optimizer's `state_dict()` is small, loads with
`torch.load(weights_only=True)` and is keyed like the HF weights; DeepSpeed's wrappers (ZeRO
partitions, fp32 master copies, loss scalers) have their own state layout and loaders that only
DeepSpeed gets right, across ranks. So: torch optimizer -> optimizer.pt, anything DeepSpeed wraps
-> DeepSpeed's format. On the ds/ path DeepSpeed restores the weights too (hf/ stays the export).

Atomicity: everything is written into `checkpoints/.tmp-step_000123/`, fsynced, then renamed; a
crash leaves a `.tmp-*` folder that the next save removes and `latest_checkpoint` never returns.
Multi-rank: call `save_checkpoint` on every rank (ZeRO state is collective); rank 0 writes the rest.

Run: `python -c "from learner.checkpoint import latest_checkpoint; print(latest_checkpoint('runs/x'))"`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from learner.lora import is_adapted, load_adapter, merged_state_dict, save_adapter

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
MARKER = "COMPLETE"
STATE = "state.json"
OPTIMIZER = "optimizer.pt"
HF = "hf"
DS = "ds"
DS_TAG = "zero"
ADAPTER = "adapter"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded; the message names the offending file."""


# ---------------------------------------------------------------------------------------------
# RNG state as JSON
# ---------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def rng_state() -> dict:
    """Python `random`, numpy global and torch CPU (+ CUDA when present) generator states, as JSON."""
    version, mt, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": list(mt), "gauss": gauss},
        "numpy": {"kind": kind, "key": _b64(np.asarray(key, dtype=np.uint32).tobytes()),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state()` returned."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npy = state["numpy"]
    key = np.frombuffer(base64.b64decode(npy["key"]), dtype=np.uint32)
    np.random.set_state((npy["kind"], key, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]]
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _uses_torch_optimizer(engine) -> bool:
    """True when the engine steps a plain torch optimizer (ZeRO 0, fp32): optimizer.pt path."""
    return isinstance(getattr(engine, "optimizer", None), torch.optim.Optimizer)


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


def _problem(path: Path) -> str | None:
    """Why `path` is not a usable checkpoint (naming the file), or None when it is."""
    marker, state = path / MARKER, path / STATE
    if not marker.is_file():
        return f"{marker} missing (partial write)"
    if not state.is_file():
        return f"{state} missing"
    data = state.read_bytes()
    if hashlib.sha256(data).hexdigest() != marker.read_text().strip():
        return f"{state} does not match the sha256 in {marker}"
    try:
        json.loads(data)
    except ValueError as e:
        return f"{state} does not parse: {e}"
    if not (path / HF / "config.json").is_file():
        return f"{path / HF / 'config.json'} missing"
    return None


def _step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# Save
# ---------------------------------------------------------------------------------------------


def _save_weights(engine, tokenizer, hf_dir: Path) -> None:
    """hf/ on rank 0; under ZeRO-3 the full weights are gathered first (a collective); under
    LoRA hf/ gets the merged weights and adapter/ beside it the adapter and its base."""
    module = engine.module
    state_dict = None
    if engine.zero_optimization_stage() == 3:
        state_dict = engine._zero3_consolidated_16bit_state_dict()
    if _rank() != 0:
        return
    if is_adapted(module):
        module.get_base_model().save_pretrained(hf_dir, state_dict=merged_state_dict(module))
        save_adapter(module, hf_dir.parent / ADAPTER)
    else:
        module.save_pretrained(hf_dir, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(hf_dir)


def _save_optimizer(engine, tmp: Path) -> None:
    if _uses_torch_optimizer(engine):
        if _rank() == 0:
            scheduler = getattr(engine, "lr_scheduler", None)
            torch.save({
                "optimizer": engine.optimizer.state_dict(),
                "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
                "engine": {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
                           "skipped_steps": engine.skipped_steps},
            }, tmp / OPTIMIZER)
    elif getattr(engine, "optimizer", None) is not None:
        # Every rank writes its own ZeRO partition; DeepSpeed synchronises the ranks itself.
        engine.save_checkpoint(str(tmp / DS), tag=DS_TAG, client_state={}, save_latest=False)


def save_checkpoint(run_dir: str | Path, step: int, engine, tokenizer, run_state: dict,
                    keep_last: int | None = 3) -> Path:
    """Write `run_dir/checkpoints/step_{step:06d}/` atomically and keep the newest `keep_last`
    complete checkpoints (None or 0 keeps all). Call on every rank. Returns the folder."""
    state_bytes = json.dumps(run_state).encode()  # fails here, before any I/O, if not JSON-able
    final = checkpoint_dir(run_dir, step)
    root = final.parent
    tmp = root / f".tmp-{final.name}"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    _save_weights(engine, tokenizer, tmp / HF)
    _save_optimizer(engine, tmp)
    _barrier()
    if _rank() == 0:
        (tmp / STATE).write_bytes(state_bytes)
        _fsync_tree(tmp)
        (tmp / MARKER).write_text(hashlib.sha256(state_bytes).hexdigest() + "\n")
        _fsync_tree(tmp)
        if final.exists():  # the same step saved again (e.g. after a resume): replace it
            old = root / f".old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
        if keep_last:
            _prune(Path(run_dir), keep_last, keep=final)
    _barrier()
    return final


def _prune(run_dir: Path, keep_last: int, keep: Path) -> None:
    """Delete all but the newest `keep_last` complete checkpoints, and stale `.tmp-*` folders."""
    complete = [p for _, p in _step_dirs(run_dir) if _problem(p) is None]
    for path in complete[:-keep_last]:
        if path != keep:
            shutil.rmtree(path)
    for stale in (run_dir / CHECKPOINTS).glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Find and load
# ---------------------------------------------------------------------------------------------


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete, uncorrupted checkpoint of the run, or None. Partial or corrupt ones
    are skipped with a warning naming them; this never raises on them."""
    for stale in sorted((Path(run_dir) / CHECKPOINTS).glob(".tmp-*")):
        log.warning("ignoring partial checkpoint write %s", stale)
    for _, path in reversed(_step_dirs(Path(run_dir))):
        try:
            problem = _problem(path)
        except OSError as e:
            problem = f"unreadable: {e}"
        if problem is None:
            return path
        log.warning("skipping checkpoint %s: %s", path, problem)
    return None


def _hf_state_dict(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index} does not parse: {e}") from e
    elif (hf_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise CheckpointError(f"{hf_dir} holds no model.safetensors")
    state_dict = {}
    for name in files:
        try:
            state_dict.update(load_file(hf_dir / name, device="cpu"))
        except Exception as e:
            raise CheckpointError(f"{hf_dir / name} cannot be read: {e}") from e
    return state_dict


def _unmatched(saved: dict, target: dict) -> list[str]:
    """Keys that do not line up; a missing key is fine when it is tied to (shares memory with)
    a saved one, e.g. lm_head.weight tied to the embeddings."""
    loaded_ptrs = {target[k].data_ptr() for k in saved if k in target}
    unexpected = [k for k in saved if k not in target]
    missing = [k for k in target if k not in saved and target[k].data_ptr() not in loaded_ptrs]
    return unexpected + missing


def _load_hf_weights(hf_dir: Path, module: torch.nn.Module) -> None:
    saved = _hf_state_dict(hf_dir)
    target = module.state_dict()
    if _unmatched(saved, target):
        # Key names on disk can differ from the module's (transformers converts some layouts on
        # save); let from_pretrained undo that, then copy.
        dtype = next(module.parameters()).dtype
        saved = type(module).from_pretrained(hf_dir, dtype=dtype).state_dict()
        if bad := _unmatched(saved, target):
            raise CheckpointError(f"{hf_dir}: weights do not match the model: {bad[:5]}")
    try:
        module.load_state_dict(saved, strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"{hf_dir}: weights do not fit the model: {e}") from e


def _load_optimizer(path: Path, engine) -> None:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{path} cannot be read: {e}") from e
    if not _uses_torch_optimizer(engine):
        raise CheckpointError(f"{path} holds a torch optimizer's state, but this engine's optimizer "
                              f"is {type(engine.optimizer).__name__} (ZeRO/mixed precision changed?)")
    try:
        engine.optimizer.load_state_dict(blob["optimizer"])
        scheduler = getattr(engine, "lr_scheduler", None)
        if scheduler is not None and blob.get("lr_scheduler") is not None:
            scheduler.load_state_dict(blob["lr_scheduler"])
        counters = blob.get("engine", {})
        for name in ("global_steps", "global_samples", "skipped_steps"):
            if name in counters:
                setattr(engine, name, counters[name])
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path} does not fit this optimizer: {e}") from e


def _load_deepspeed(ds_dir: Path, engine) -> None:
    try:
        load_path, _ = engine.load_checkpoint(str(ds_dir), tag=DS_TAG, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
    except Exception as e:
        raise CheckpointError(f"{ds_dir / DS_TAG} cannot be loaded: {type(e).__name__}: {e}") from e
    if load_path is None:
        raise CheckpointError(f"{ds_dir / DS_TAG}: DeepSpeed found no checkpoint to load")


def load_checkpoint(path: str | Path, engine) -> dict:
    """Restore weights, optimizer and lr scheduler into `engine`; return the saved run state.
    Call on every rank. Raises CheckpointError naming the file when anything is missing or
    corrupt."""
    path = Path(path)
    try:
        problem = _problem(path)
    except OSError as e:
        problem = f"{path} unreadable: {e}"
    if problem:
        raise CheckpointError(problem)
    run_state = json.loads((path / STATE).read_bytes())
    adapted = is_adapted(engine.module)
    if adapted and not (path / ADAPTER).is_dir():
        raise CheckpointError(f"{path / ADAPTER} missing: {path} is not a model.lora run's "
                              "checkpoint (resume it with model.lora.rank 0)")
    if not adapted and (path / ADAPTER).is_dir():
        raise CheckpointError(f"{path} holds a LoRA adapter ({path / ADAPTER}): resume it with "
                              "the run's model.lora settings")
    if adapted:  # onto its own base; on the ds/ path DeepSpeed then restores every weight
        try:
            load_adapter(path / ADAPTER, engine.module)
        except ValueError as e:
            raise CheckpointError(str(e)) from e
    if (path / DS).is_dir():
        _load_deepspeed(path / DS, engine)  # weights, optimizer, scheduler, counters
    else:
        if not adapted:
            _load_hf_weights(path / HF, engine.module)
        if (path / OPTIMIZER).is_file():
            _load_optimizer(path / OPTIMIZER, engine)
        elif getattr(engine, "optimizer", None) is not None:
            raise CheckpointError(f"{path / OPTIMIZER} missing (and no {path / DS})")
    _barrier()
    return run_state
