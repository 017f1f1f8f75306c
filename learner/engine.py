"""The learner's DeepSpeed engine: the only module that imports DeepSpeed.

On CPU, DeepSpeed runs over gloo (no oneCCL or Intel extension needed); on GPU over NCCL with ZeRO.
Rank discovery is the usual MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE / LOCAL_RANK.
"""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM

from learner.lora import is_adapted, merged_parameters, with_adapter
from protocol.config import Config
from protocol.weights import listen_refusal


def init_learner_distributed(cfg: Config, rank: int, world_size: int) -> None:
    import deepspeed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(cfg.net.master_port))
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    # DeepSpeed's CPU shared-memory allreduce is a C++ extension compiled on first use (about
    # 30 s to 2 min on a fresh machine); gloo alone is fast enough for these sizes.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    backend = "nccl" if cfg.model.device.startswith("cuda") else "gloo"
    try:
        deepspeed.init_distributed(dist_backend=backend)
    except torch.distributed.DistNetworkError as e:
        # rank 0 listens for the others at MASTER_ADDR:MASTER_PORT (net.master_port)
        refusal = listen_refusal(e, int(os.environ["MASTER_PORT"]),
                                 "net.master_port") if rank == 0 else None
        if refusal is not None:
            raise refusal from None
        raise


def leave_distributed() -> None:
    """Tear down the learner ranks' default process group before the interpreter exits: a gloo
    group left to interpreter shutdown can abort the process ("terminate called without an
    active exception"), turning a finished rank's exit code into a failure. Local, no collective."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def build_engine(cfg: Config, model_path: str):
    """A DeepSpeed engine around the HF model at `model_path`, with AdamW. No scheduler: the
    learning rate is set from the learner step before each update (`set_learning_rate`)."""
    import deepspeed

    model = policy_model(cfg, model_path)
    # under LoRA only the adapter's parameters train: the optimizer holds state for them alone
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, **adamw_kwargs(cfg))
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                      config=deepspeed_config(cfg))
    return engine


def policy_model(cfg: Config, model_path: str):
    """The HF model the engine trains: float32 master weights, activations recomputed in the
    backward pass under learner.grad_checkpointing; under model.lora a LoRA adapter on the
    frozen base (learner/lora.py)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if cfg.learner.grad_checkpointing:
        model.gradient_checkpointing_enable()
        if cfg.model.lora.rank:  # frozen embeddings: checkpointed blocks need an input grad
            model.enable_input_require_grads()
    if cfg.model.lora.rank:
        model = with_adapter(model, cfg.model.lora)
    return model


def adamw_kwargs(cfg: Config) -> dict:
    """The policy's AdamW settings (the rate is set per learner step, `set_learning_rate`)."""
    return {"lr": cfg.optim.lr, "weight_decay": cfg.optim.weight_decay}


def deepspeed_config(cfg: Config) -> dict:
    """The learner engine's DeepSpeed config."""
    return {
        "train_micro_batch_size_per_gpu": 1,  # rows are batched by the trainer, not DeepSpeed
        "gradient_accumulation_steps": 1,  # the trainer marks accumulation boundaries itself
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": {"stage": cfg.optim.zero_stage},
        "bf16": {"enabled": cfg.optim.bf16},
        "steps_per_print": 10**9,
    }


def learning_rate(lr: float, warmup_steps: int, step: int) -> float:
    """The learning rate of learner step `step` (0-based): linear warm-up to `lr` over
    `warmup_steps` learner steps, constant within a learner step (verl sets it once per rollout
    step, too). A function of the step alone, so a step or mini-batch that takes no optimizer step
    (no row carries gradient) does not stretch the warm-up, and a resumed run needs no saved
    scheduler state."""
    return lr * min(1.0, (step + 1) / max(1, warmup_steps))


def set_learning_rate(engine, lr: float) -> None:
    """Set `lr` on every parameter group the engine's optimizer steps (under ZeRO its wrapper
    shares the client optimizer's groups)."""
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def build_reference(cfg: Config, engine=None):
    """The KL reference policy (docs/ALGORITHMS.md 1.5): a frozen copy of the initial weights, read
    from model.path (the run's initial model, also after a resume), in the learner's compute
    dtype; None when loss.kl_beta is 0. Under model.lora the policy's own module, `engine`'s,
    whose base is those weights: a reference pass switches its adapter off (learner/lora.py
    `reference_off`). ZeRO 0-2 keep a copy whole on the learner's device beside the policy (a
    plain module); ZeRO-3 makes it an inference-only ZeRO-3 engine (no optimizer), its
    parameters offloaded to CPU memory on GPU and gathered layer by layer in its forward."""
    if cfg.loss.kl_beta == 0:
        return None
    if cfg.model.lora.rank:
        return engine.module
    dtype = torch.bfloat16 if cfg.optim.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
    model.requires_grad_(False).eval()
    if cfg.optim.zero_stage != 3:
        device = cfg.model.device
        if device.startswith("cuda") and ":" not in device:
            device = f"cuda:{torch.cuda.current_device()}"
        return model.to(device)
    import deepspeed

    zero = {"stage": 3}
    if cfg.model.device.startswith("cuda"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    engine, *_ = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 1, "zero_optimization": zero,
        "bf16": {"enabled": cfg.optim.bf16}, "steps_per_print": 10**9})
    engine.eval()
    return engine  # its forward hooks gather the shards; learner/logprobs.py unwraps .module


def publish_weights(engine, weights, bucket_bytes: int) -> tuple[int, int]:
    """Broadcast the full parameters to the actors; under ZeRO-3 each bucket is gathered from
    its shards just before it is sent, so the full model never sits in memory at once; under
    LoRA the whole weights with the adapter merged in. Returns the buckets and bytes sent."""
    import deepspeed

    if is_adapted(engine.module):  # whole weights, the adapter merged in (ZeRO 0-2)
        return weights.send(merged_parameters(engine.module), bucket_bytes)
    gather = None
    if engine.zero_optimization_stage() == 3:
        gather = lambda params: deepspeed.zero.GatheredParameters(params)  # noqa: E731
    return weights.send(engine.module.named_parameters(), bucket_bytes, gather=gather)
