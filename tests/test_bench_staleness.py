"""`rlvr bench staleness`'s reduction (rlvr/bench/staleness.py): cells of final accuracy against
injected staleness per objective, the drop from K = 0, and the tolerance read off the curve."""

import pytest

from rlvr.bench.staleness import OBJECTIVES, reduce_cells, report, tolerance
from rlvr.cli import main


def rows(final_avg, clip=0.01, stale=None):
    """Metric rows of a finished run: step 0 (eval before RL), two training steps, the last
    with the final evaluation."""
    return [{"step": 0, "eval/avg@8": 0.4, "eval/pass@8": 0.6},
            {"step": 1, "pg/clip_frac": 0.0, "stale/mean": stale, "is/w_mean": 1.0},
            {"step": 2, "pg/clip_frac": clip, "stale/mean": stale, "is/w_mean": 0.9,
             "eval/avg@8": final_avg, "eval/pass@8": final_avg + 0.2}]


def test_cells_average_the_final_evaluation_over_seeds_and_measure_the_drop_from_k_0():
    runs = [("naive", 0, 0, rows(0.60)), ("naive", 0, 1, rows(0.62)),
            ("naive", 16, 0, rows(0.55, clip=0.2, stale=16)),
            ("naive", 16, 1, rows(0.57, clip=0.4, stale=16)),
            ("m2po", 16, 0, rows(0.60)), ("m2po", 0, 0, rows(0.61))]
    cells = reduce_cells(runs)
    assert list(cells["naive"]) == [0, 16] and list(cells["m2po"]) == [0, 16]
    assert cells["naive"][0]["eval/avg@8"]["mean"] == pytest.approx(0.61)
    assert cells["naive"][0]["eval/avg@8"]["std"] == pytest.approx(0.0141421, abs=1e-6)
    assert cells["naive"][16]["drop_points"] == pytest.approx(5.0)
    assert cells["m2po"][16]["drop_points"] == pytest.approx(1.0)
    assert cells["m2po"][16]["eval/avg@8"]["std"] is None  # one seed: no spread
    # training means over the training rows of each run, then over seeds
    assert cells["naive"][16]["pg/clip_frac"] == pytest.approx((0.1 + 0.2) / 2)
    assert cells["naive"][16]["stale/mean"] == 16 and cells["naive"][0]["stale/mean"] is None
    assert cells["naive"][16]["eval/pass@8"]["mean"] == pytest.approx(0.76)
    text = report({"config": "c.yaml", "overrides": ["mode=sync"], "cells": cells})
    assert "| naive | 16 | 2 | 0.560 ± 0.014 | 5.0 |" in text
    assert "- naive: K = 0" in text and "- m2po: K = 16" in text


def test_tolerance_is_the_last_k_before_the_first_drop_over_the_threshold():
    by_k = {0: {"drop_points": 0.0}, 4: {"drop_points": 1.5}, 16: {"drop_points": 2.5},
            64: {"drop_points": 1.0}}  # a later K back within 2 points does not count
    assert tolerance(by_k) == 4
    assert tolerance(by_k, points=3.0) == 64


@pytest.mark.parametrize("flags,message", [
    (["--objectives", "ppo"], "--objectives: unknown ['ppo']"),
    (["--inject", "0,-4"], "--inject: staleness values >= 0"),
    (["--seeds", "0"], "--seeds must be >= 1"),
])
def test_bad_arguments_are_refused_before_any_run_starts(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "staleness", "configs/tiny-cpu.yaml", "--out", str(tmp_path), *flags])
    assert message in str(e.value)
    assert not any(tmp_path.iterdir())


def test_every_objective_is_a_config_the_loader_accepts():
    from pathlib import Path

    from protocol.config import load_config

    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny-cpu.yaml"
    for name, overrides in OBJECTIVES.items():
        cfg = load_config(tiny, ["mode=sync", "max_staleness=0", *overrides, "stale_inject=4"])
        assert cfg.stale_inject == 4, name
