"""Shared fixtures: a quickly warm-started tiny model and a way to run `rlvr` as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny-cpu.yaml"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny model after a short warm start (enough for mixed groups, not for accuracy)."""
    from rlvr.warm_start import ensure_warm_start
    from protocol.config import load_config

    cache = tmp_path_factory.mktemp("warm")
    cfg = load_config(TINY, [f"warm_start.cache_dir={cache}", "warm_start.steps=60"])
    return ensure_warm_start(cfg, log=lambda *_: None)


def run_rlvr(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true"}
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def quick_run_args(run_dir: Path, model: Path, *overrides: str) -> list[str]:
    """A few-step run of the tiny config in `run_dir` (tmp), small enough for CI."""
    return ["train", str(TINY), f"run.out_dir={run_dir.parent}", f"run.name={run_dir.name}",
            f"model.path={model}", "run.wandb=disabled", "run.progress=false",
            "task.eval_per_level=8", "rollout.prompts_per_step=8", "rollout.prompts_per_work=4",
            *overrides]
