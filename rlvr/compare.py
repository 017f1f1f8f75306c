"""`rlvr compare`: one table and overlaid PNG curves from several run folders.

    rlvr compare runs/a runs/b [--out DIR]

What: `compare_runs(run_dirs, out_dir)` reads each run's `metrics.jsonl` (so finished, crashed and
running runs all work), writes `DIR/compare_<curve>.png` (one colour per run) and `DIR/compare.md`,
and returns the markdown table. `rlvr sweep` ends with the same table and plots over its runs.

Per run (`run_summary`): steps, steps/min over the steady window (evaluations left out, the first
tenth and the last step too: rlvr/bench/run_metrics.py), generated responses in all and per prompt,
the last held-out eval/avg@k and eval/pass@k, the mean and largest staleness of trained samples
and the wall time. Curves (each skipped when no run logged its keys): steps/min, cumulative
generated responses, held-out accuracy, staleness, training reward, responses per prompt.

The single-run plots the learner writes at the end of a run stay in learner/plots.py; the
drawing helpers are shared from there.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from learner.plots import draw, new_axes, save_png, series
from learner.progress import fmt_duration, is_scalar
from learner.run_log import read_metrics
from rlvr.bench.run_metrics import run_throughput, total, training_rows, values

_EVAL_AVG = re.compile(r"^eval/avg@(\d+)$")


def eval_k(rows: list[dict]) -> int:
    """k of the run's eval/avg@k (task.eval_samples), 8 when none was logged."""
    for r in rows:
        for key in r:
            if m := _EVAL_AVG.match(key):
                return int(m.group(1))
    return 8


def steps_per_min_series(rows: list[dict]) -> tuple[list[int], list[float]]:
    """Per step: 60 / (step seconds without its evaluation)."""
    pts = []
    for r in training_rows(rows):
        t = r.get("perf/step_time")
        if is_scalar(t):
            t -= r["timing/eval"] if is_scalar(r.get("timing/eval")) else 0.0
            if t > 0:
                pts.append((r["step"], 60.0 / t))
    return [s for s, _ in pts], [v for _, v in pts]


def responses_series(rows: list[dict]) -> tuple[list[int], list[float]]:
    """Per step: responses generated up to and including it."""
    steps, out, acc = [], [], 0.0
    for r in training_rows(rows):
        if is_scalar(r.get("gen/responses_per_step")):
            acc += r["gen/responses_per_step"]
            steps.append(r["step"])
            out.append(acc)
    return steps, out


def curves(k: int) -> list[tuple[str, str, str, list]]:
    """(file stem, title, y label, [(label, style, rows -> (steps, values))])."""
    def key(name):
        return lambda rows: series(rows, name)
    return [
        ("steps_per_min", "Learner steps per minute", "steps / min",
         [("steps/min", "-", steps_per_min_series)]),
        ("responses_generated", "Generated responses", "responses (cumulative)",
         [("responses", "-", responses_series)]),
        ("eval", "Held-out accuracy", "accuracy",
         [(f"eval/avg@{k}", "-", key(f"eval/avg@{k}")),
          (f"eval/pass@{k}", "--", key(f"eval/pass@{k}"))]),
        ("staleness", "Staleness of trained samples", "policy versions",
         [("stale/mean", "-", key("stale/mean")), ("stale/max", "--", key("stale/max"))]),
        ("reward", "Training reward", "reward",
         [("reward/acc_mean", "-", key("reward/acc_mean")),
          ("reward/train_mean", "--", key("reward/train_mean"))]),
        ("responses_per_prompt", "Responses per prompt", "responses / prompt",
         [("gen/responses_per_prompt", "-", key("gen/responses_per_prompt"))]),
    ]


def run_summary(rows: list[dict]) -> dict:
    """The table's numbers for one run (None where the run did not log them)."""
    k = eval_k(rows)
    train = training_rows(rows)
    skip = max(1, len(train) // 10)

    def last(key):
        found = series(rows, key)[1]
        return found[-1] if found else None

    responses = total(values(train, "gen/responses_per_step"))
    stale_mean = values(train, "stale/mean")
    return {
        "steps": train[-1]["step"] if train else None,
        "steps_per_min": run_throughput(rows, 1, skip)["steps_per_min"] if train else None,
        "responses": responses,
        "responses_per_prompt": _avg(values(train, "gen/responses_per_prompt")),
        f"eval/avg@{k}": last(f"eval/avg@{k}"),
        f"eval/pass@{k}": last(f"eval/pass@{k}"),
        "stale_mean": _avg(stale_mean),
        "stale_max": max(values(train, "stale/max"), default=None),
        "wall_s": rows[-1].get("time_s") if rows else None,
        "k": k,
    }


def _avg(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def table(labels: list[str], summaries: list[dict], label_header: str = "run") -> str:
    """Markdown table of `run_summary` dicts (one row per label)."""
    k = summaries[0]["k"] if summaries else 8
    header = (f"| {label_header} | steps | steps/min | responses | responses/prompt | "
              f"eval/avg@{k} | eval/pass@{k} | stale mean | stale max | wall time |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    lines = []
    for label, s in zip(labels, summaries):
        wall = "-" if s["wall_s"] is None else fmt_duration(s["wall_s"])
        responses = "-" if s["responses"] is None else f"{s['responses']:,.0f}"
        stale_max = "-" if s["stale_max"] is None else f"{s['stale_max']:.0f}"
        lines.append(f"| {label} | {fmt(s['steps'])} | {fmt(s['steps_per_min'], 1)} | "
                     f"{responses} | {fmt(s['responses_per_prompt'], 2)} | "
                     f"{fmt(s.get(f'eval/avg@{k}'))} | {fmt(s.get(f'eval/pass@{k}'))} | "
                     f"{fmt(s['stale_mean'], 2)} | {stale_max} | {wall} |")
    return header + "\n".join(lines) + "\n"


def labels_for(run_dirs: list[Path]) -> list[str]:
    names = [d.name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{d.parent.name}/{d.name}" for d in run_dirs]


def overlay(all_rows: list[list[dict]], labels: list[str], out_dir: Path) -> list[Path]:
    """One PNG per curve, every run in its own colour; curves no run logged are skipped."""
    k = eval_k([r for rows in all_rows for r in rows[:1] + rows[-1:]])
    pngs = []
    for stem, title, ylabel, keys in curves(k):
        fig, ax = new_axes(title, ylabel)
        drawn = 0
        for i, (label, rows) in enumerate(zip(labels, all_rows)):
            for name, style, get in keys:
                steps, ys = get(rows)
                if steps:
                    draw(ax, steps, ys, label=label if len(keys) == 1 else f"{label} {name}",
                          style=style, color=f"C{i % 10}")
                    drawn += 1
        if drawn:
            ax.legend(fontsize="small")
            pngs.append(save_png(fig, out_dir / f"compare_{stem}.png"))
    return pngs


def compare_runs(run_dirs: list[str | Path], out_dir: str | Path,
                 labels: list[str] | None = None) -> tuple[str, list[Path]]:
    """Overlay the runs' curves into `out_dir/compare_<curve>.png` and return (markdown table,
    PNG paths). The table is also written to `out_dir/compare.md`."""
    run_dirs = [Path(d) for d in run_dirs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = labels or labels_for(run_dirs)
    all_rows = [read_metrics(d) for d in run_dirs]
    pngs = overlay(all_rows, labels, out_dir)
    text = table(labels, [run_summary(rows) for rows in all_rows])
    (out_dir / "compare.md").write_text(text)
    return text, pngs
