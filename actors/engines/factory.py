"""An engine by name: `make_engine("hf" | "vllm", model_path, ...)`. Kept apart from the Protocol
and result types (actors/engines/__init__.py), which every engine imports, so that no engine
module and the package import each other; vLLM is imported only when it is chosen."""

from __future__ import annotations

from actors.engines import Engine


def make_engine(kind: str, model_path: str, **kw) -> Engine:
    match kind:
        case "hf":
            from tasks.hf_engine import HFEngine
            return HFEngine.load(model_path, **kw)
        case "vllm":
            from actors.engines.vllm import VLLMEngine  # imports vLLM itself, with a hint
            return VLLMEngine(model_path, **kw)
        case _:
            raise ValueError(f"unknown engine {kind!r}; expected 'hf' or 'vllm'")
