"""The calibration table: a bound's distance from the mean, the chance that a run crosses it, and
the table in tests/README.md, generated from the saved values and covering every recorded one."""

import ast
import json
import math
import re
from pathlib import Path

import pytest

from tests.calibration import (CONTROL, MIN_RUNS, MIN_SIGMAS, README, kernel_path, main,
                               meets_bar, readme_with_table, record, saved_lines, short_rows,
                               suite_fail_rate, summarize, t_tail, unmeasured_on)


def line(value, low=None, high=None, name="t", condition="here"):
    return {"test": "x.py::t", "name": name, "value": value, "low": low, "high": high,
            "condition": condition}


def test_the_nearest_bound_counts_in_standard_deviations():
    [row] = summarize([line(v, low=0.0, high=20.0) for v in (4.0, 5.0, 6.0)])
    assert (row["runs"], row["mean"], row["sd"]) == (3, 5.0, 1.0)
    assert row["sigmas"] == 5.0  # the nearer end, 5 away; sd 1
    [row] = summarize([line(v, low=4.5) for v in (4.0, 5.0, 6.0)])
    assert row["sigmas"] == 0.5 and row["sigmas"] < MIN_SIGMAS


def test_a_value_that_never_varied_is_infinitely_far_only_inside_its_bound():
    assert summarize([line(1.0, low=0.0)] * 5)[0]["sigmas"] == math.inf
    assert summarize([line(1.0, low=0.0)] * 5)[0]["fail"] == 0.0
    assert summarize([line(1.0, low=1.0)] * 5)[0]["sigmas"] == 0.0
    assert summarize([line(1.0, low=1.0)] * 5)[0]["fail"] == 1.0


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5, 7.0])
def test_the_t_tail_matches_its_closed_forms(t):
    assert t_tail(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-9)  # Cauchy
    assert t_tail(t, 2) == pytest.approx(0.5 * (1 - t / math.sqrt(2 + t * t)), rel=1e-9)
    assert t_tail(t, 10**6) == pytest.approx(0.5 * math.erfc(t / math.sqrt(2)), rel=1e-3)
    assert t_tail(-t, 5) == pytest.approx(1 - t_tail(t, 5), rel=1e-12)


def test_the_chance_of_a_crossing_is_the_next_runs_predictive_t():
    values = [4.0, 5.0, 6.0, 5.0, 5.0]  # mean 5, sd sqrt(0.5)
    [row] = summarize([line(v, low=2.0, high=9.0) for v in values])
    scale = math.sqrt(0.5) * math.sqrt(1 + 1 / 5)
    assert row["fail"] == pytest.approx(t_tail(3 / scale, 4) + t_tail(4 / scale, 4))
    ten = [5.0 + d for d in (-1.5, -1, -0.5, 0, 0, 0, 0, 0.5, 1, 1.5)]
    sd = summarize([line(v, low=0) for v in ten])[0]["sd"]
    near, far = (summarize([line(v, low=5.0 - k * sd) for v in ten])[0] for k in (3.0, 4.6))
    assert near["fail"] > 0.001 and not meets_bar(near)  # 3 sd over ten runs: 0.0075 a run
    assert far["fail"] < 0.001 and meets_bar(far)
    assert not meets_bar({**far, "runs": MIN_RUNS - 1})


def test_a_control_misses_when_the_wrong_code_would_pass():
    [control] = summarize([line(v, low=0.1, condition=f"{CONTROL} off")
                           for v in (0.0, 0.01, -0.01)])
    assert control["sigmas"] == pytest.approx(10.0)  # 0.1 above its mean, sd 0.01
    assert control["fail"] == pytest.approx(t_tail(0.1 / (0.01 * math.sqrt(4 / 3)), 2))
    bound = summarize([line(v, low=0.1) for v in (0.3, 0.31, 0.29)])
    assert suite_fail_rate([control, *bound]) == pytest.approx(bound[0]["fail"])


def test_the_suite_chance_per_kernel_path_takes_that_paths_rows_and_counts_the_bounds_it_lacks():
    avx2 = summarize([line(v, low=0.1, condition="AVX2, idle") for v in (0.3, 0.32, 0.28)])
    avx512 = summarize([line(v, low=0.1, condition="AVX-512 (AMX), idle")
                        for v in (0.2, 0.25, 0.15)])
    other = summarize([line(v, high=2.0, name="s") for v in (1.0, 1.1, 0.9)])
    rows = [*avx2, *avx512, *other]  # the second bound names no path: it counts on both
    assert kernel_path("AVX-512 (AMX), run.seed 0-4") == "AVX-512"
    assert kernel_path("AVX2, beside the busy lane") == "AVX2" and kernel_path("idle") is None
    assert suite_fail_rate(rows, "AVX2") == pytest.approx(
        1 - (1 - avx2[0]["fail"]) * (1 - other[0]["fail"]))
    assert suite_fail_rate(rows) == pytest.approx(  # the worst of the two paths
        1 - (1 - avx512[0]["fail"]) * (1 - other[0]["fail"]))
    assert unmeasured_on(rows, "AVX2") == 0 and unmeasured_on(avx512 + other, "AVX2") == 1


def test_record_writes_only_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "cal.jsonl"
    monkeypatch.delenv("RLVR_CALIBRATION_LOG", raising=False)
    record("elapsed s", 0.2, high=2.0)
    assert not log.exists()
    monkeypatch.setenv("RLVR_CALIBRATION_LOG", str(log))
    monkeypatch.setenv("RLVR_CALIBRATION_CONDITION", "idle")
    record("elapsed s", 0.2, high=2.0)
    record("elapsed s", 0.3, high=2.0)
    [row] = summarize([json.loads(x) for x in log.read_text().splitlines()])
    assert row["runs"] == 2 and row["high"] == 2.0 and row["condition"] == "idle"


def test_the_command_fails_when_a_bound_sits_too_close(tmp_path):
    test = tmp_path / "test_noisy.py"
    runs = tmp_path / "runs"  # each run records the next of 0, 0.5, 1: mean 0.5, sd 0.5
    test.write_text("from pathlib import Path\nfrom tests.calibration import record\n\n"
                    "def test_noisy():\n"
                    f"    runs = Path({str(runs)!r})\n"
                    "    n = len(runs.read_text()) if runs.exists() else 0\n"
                    "    runs.write_text('x' * (n + 1))\n"
                    "    record('value', [0.0, 0.5, 1.0][n], high=0.95)\n")
    assert main(["run", "--runs", "3", "--condition", "here", "--log",
                 str(tmp_path / "cal.jsonl"), str(test)]) == 1


def test_the_readme_table_is_generated_from_the_saved_values():
    readme = README.read_text()
    assert readme == readme_with_table(readme, summarize(saved_lines())), (
        "tests/README.md's calibration table is out of date: "
        "python -m tests.calibration table --write")


def recorded_names() -> list[tuple[str, str]]:
    """(test file, a regex of the name) of every `record(...)` call in the suite; an f-string's
    fields match anything."""
    found = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "record"
                    and node.args):
                arg = node.args[0]
                parts = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
                regex = "".join(re.escape(p.value) if isinstance(p, ast.Constant) else ".+"
                                for p in parts)
                found.append((f"tests/{path.name}", regex))
    return found


def test_every_recorded_value_has_a_calibration_row_and_each_calibrated_row_meets_the_bar():
    rows = summarize(saved_lines())
    names = recorded_names()
    assert len(names) >= 20  # the parse found the suite's calls
    missing = [(f, n) for f, n in names
               if not any(r["test"].startswith(f + "::") and re.fullmatch(n, r["name"])
                          for r in rows)]
    assert not missing, f"recorded but never calibrated: {missing}"
    below = [(r["test"], r["name"], r["condition"]) for r in short_rows(rows)
             if r["runs"] >= MIN_RUNS]
    assert not below, f"calibrated on {MIN_RUNS}+ runs, yet too close to the bound: {below}"
