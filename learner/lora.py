"""LoRA on the learner (`model.lora`): a PEFT adapter trained instead of every weight.

What: `with_adapter` wraps the policy in a PEFT LoRA adapter of `model.lora.rank` on
`model.lora.target_modules`, its base weights frozen, so only the adapter's parameters have
gradients and optimizer state. `merged_parameters` is the policy as whole weights, each adapted
layer's W + (alpha / r) B A under the base model's own parameter names: what the actors receive
at a sync and what a checkpoint's hf/ holds, so every reader of weights (actors, `rlvr eval`,
a restarted actor) sees a plain model. `save_adapter` / `load_adapter` write and read a
checkpoint's adapter/ (the adapter's tensors and the digest of the base they were trained on),
what a resume loads onto model.path's base.

Why merged whole weights on the wire: the actors' engines then need nothing LoRA-specific; the
adapter alone would be far fewer bytes (docs/TRAINING.md, "LoRA", says what is sent).
The KL reference is the same module with its adapter switched off (`reference_off`), never a
second copy of the base.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import torch

from protocol.config.model import LoraConfig


def with_adapter(model, lora: LoraConfig):
    """`model` (an HF causal LM) wrapped in a fresh LoRA adapter; its base weights frozen."""
    from peft import get_peft_model

    return get_peft_model(model, peft_config(lora))


def peft_config(lora: LoraConfig, **extra):
    """`model.lora` as PEFT's LoraConfig (`extra`: its other fields, e.g. the base's path)."""
    from peft import LoraConfig as PeftLoraConfig

    targets = lora.target_modules
    return PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=targets[0] if targets == ("all-linear",)
                          else list(targets), **extra)


def is_adapted(module) -> bool:
    """Does `module` (the learner's model, or what a DeepSpeed engine wraps) carry an adapter?"""
    return hasattr(module, "peft_config")


@torch.no_grad()
def merged_parameters(module) -> list[tuple[str, torch.Tensor]]:
    """The adapted `module`'s parameters as a plain model's: (the base model's name, W + the
    adapter's delta where a layer is adapted, else the base tensor itself), in the base model's
    `named_parameters` order, the adapter's own parameters left out."""
    from peft.tuners.lora import LoraLayer

    base = module.get_base_model()
    delta = {f"{name}.base_layer.weight": layer.get_delta_weight(layer.active_adapters[0])
             for name, layer in base.named_modules() if isinstance(layer, LoraLayer)}
    out = []
    for name, param in base.named_parameters():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        out.append((plain, param + delta[name].to(param.dtype) if name in delta else param))
    return out


def merged_state_dict(module) -> dict[str, torch.Tensor]:
    return {name: t.detach() for name, t in merged_parameters(module)}


def adapter_state(module) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(module).items()}


def load_adapter_state(module, state: dict[str, torch.Tensor]) -> None:
    """Put a checkpoint's adapter tensors into `module`'s adapter; every one must land."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(module, state)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"the adapter does not fit the model: missing {missing[:3]}, "
                         f"unexpected {list(result.unexpected_keys)[:3]}")


def reference_off(reference):
    """The context a KL reference pass runs in: a LoRA policy serving as its own reference runs
    with its adapter switched off; a frozen copy runs as it is."""
    if is_adapted(reference):
        return reference.disable_adapter()
    return contextlib.nullcontext()


def save_adapter(module, folder: Path) -> None:
    """A checkpoint's adapter/: the adapter's tensors (adapter.safetensors) and the base they
    were trained on (base.json: its path and weights digest)."""
    from safetensors.torch import save_file

    folder.mkdir()
    save_file(adapter_state(module), folder / "adapter.safetensors")
    base = base_path(module)
    (folder / "base.json").write_text(json.dumps({"path": base, "sha256": _digest(base)}))


def load_adapter(folder: Path, module) -> None:
    """A checkpoint's adapter/ onto `module`'s base, which must be the one it was trained on;
    ValueError naming the file otherwise."""
    from safetensors.torch import load_file

    try:
        base = json.loads((folder / "base.json").read_text())
        state = load_file(folder / "adapter.safetensors", device="cpu")
    except Exception as e:
        raise ValueError(f"{folder} cannot be read: {e}") from e
    mine = base_path(module)
    if base.get("sha256") != _digest(mine):
        raise ValueError(f"{folder / 'base.json'}: the adapter was trained on the base at "
                         f"{base.get('path')!r}, whose weights differ from model.path {mine!r}: "
                         "resume with the same model.path")
    try:
        load_adapter_state(module, state)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"{folder / 'adapter.safetensors'}: {e}") from e


def base_path(module) -> str:
    """The folder the adapted `module`'s base was loaded from (model.path)."""
    return module.peft_config[module.active_adapter].base_model_name_or_path


_DIGESTS: dict[tuple[str, float], str] = {}


def _digest(model_path: str) -> str:
    """The base's weights digest, computed once per path and modification time."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    key = (str(Path(model_path).resolve()), max((f.stat().st_mtime for f in files), default=0))
    if key not in _DIGESTS:
        _DIGESTS[key] = weights_digest(model_path)
    return _DIGESTS[key]


def weights_digest(model_path: str | Path) -> str:
    """sha256 over the weight files of an HF model folder (names and bytes, in name order): the
    base a LoRA checkpoint's adapter was trained on."""
    digest = hashlib.sha256()
    for f in sorted(Path(model_path).glob("*.safetensors")):
        digest.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                digest.update(chunk)
    return digest.hexdigest()
