"""LoRA on the learner (`model.lora`): a PEFT adapter trained instead of every weight.

What: `with_adapter` wraps the policy in a PEFT LoRA adapter of `model.lora.rank` on
`model.lora.target_modules`, its base weights frozen, so only the adapter's parameters have
gradients and optimizer state. `merged_parameters` is the policy as whole weights, each adapted
layer's W + (alpha / r) B A under the base model's own parameter names: what the actors receive
at a sync and what a checkpoint's hf/ holds, so every reader of weights (actors, `rlvr eval`,
a restarted actor) sees a plain model. `adapter_state` / `load_adapter_state` are the
adapter's tensors alone, what a checkpoint keeps to resume (the base is model.path's).

Why merged whole weights on the wire: the actors' engines then need nothing LoRA-specific; the
adapter alone would be far fewer bytes (docs/TRAINING.md, "LoRA", says what is sent).
The KL reference is the same module with its adapter switched off (`reference_off`), never a
second copy of the base.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import torch

from protocol.config.model import LoraConfig


def with_adapter(model, lora: LoraConfig):
    """`model` (an HF causal LM) wrapped in a fresh LoRA adapter; its base weights frozen."""
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    targets = lora.target_modules
    return get_peft_model(model, PeftLoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=targets[0] if targets == ("all-linear",) else list(targets)))


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
