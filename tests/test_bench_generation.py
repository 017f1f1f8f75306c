"""`rlvr bench generation` end to end at a tiny size: both engines, each in its own process,
generate and take a weight update, and results.json holds finite numbers for both side by side.
(The real-shape pair is the same code with a bigger model: BENCHMARKS.md.)"""

import json
import math

import pytest

from tests.conftest import TINY, run_rlvr

pytestmark = pytest.mark.slow


def test_generation_bench_measures_hf_and_vllm_side_by_side(tiny_model, tmp_path):
    out = tmp_path / "generation"
    done = run_rlvr("bench", "generation", str(TINY), f"model.path={tiny_model}", "--models",
                    "tiny", "--prompts", "4", "--samples", "2", "--tokens", "8", "--rounds", "2",
                    "actors.enforce_eager=true", "--out", str(out), timeout_s=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| tiny/hf |" in done.stdout and "| tiny/vllm |" in done.stdout
    r = json.loads((out / "results.json").read_text())
    for name in ("tiny/hf", "tiny/vllm"):
        pair = r["pairs"][name]
        assert pair["tokens_per_round"] > 0 and math.isfinite(pair["tokens_per_s"])
        assert pair["update_s"] > 0 and pair["update_mb"] == pytest.approx(4.2, abs=0.1)
        assert pair["params_m"] == pytest.approx(1.06, abs=0.01)
    assert math.isfinite(r["vllm_over_hf"]["tiny"]["tokens_per_s"])


def test_unknown_engines_are_refused_before_anything_starts(tmp_path):
    done = run_rlvr("bench", "generation", "--engines", "hf,sglang", "--out", str(tmp_path))
    assert done.returncode != 0 and "--engines: unknown ['sglang']" in done.stderr
