"""PNG plots and comparison tables from run folders (the backend of `rlvr compare`).

What: `plot_run(run_dir)` draws one run's curves into `run_dir/plots/`; `compare_runs(run_dirs,
out_dir)` overlays several runs and returns a markdown table of final values. Both read only
`metrics.jsonl` (see `learner/run_log.py`), so they work on finished, crashed or running runs.

Curves (keys from ALGORITHMS.md section 9), each skipped when none of its keys was logged:
  reward.png                reward/acc_mean (solid), reward/train_mean (dashed) vs step
  eval.png                  eval/avg@8 (solid), eval/pass@8 (dashed) vs step (held-out accuracy)
  responses_per_prompt.png  gen/responses_per_prompt vs step (the sample cost per prompt)
Noisy per-step curves are drawn faint with a moving average on top.

Why no pyplot: `matplotlib.figure.Figure` renders with Agg and touches no global backend state,
so plotting inside the learner process or a test never opens a window or fights another user.

Run: `python -c "from learner.plots import plot_run; print(plot_run('runs/x'))"`.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from learner.run_log import fmt_duration, is_scalar, read_metrics

# (file stem, title, y label, [(key, line style)])
CURVES = [
    ("reward", "Training reward", "reward",
     [("reward/acc_mean", "-"), ("reward/train_mean", "--")]),
    ("eval", "Held-out accuracy", "accuracy", [("eval/avg@8", "-"), ("eval/pass@8", "--")]),
    ("responses_per_prompt", "Responses per prompt", "responses / prompt",
     [("gen/responses_per_prompt", "-")]),
]
SMOOTH_MIN_POINTS = 20  # below this, raw points only


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over the rows where it is a finite number."""
    pairs = [(r["step"], float(r[key])) for r in rows if is_scalar(r.get(key)) and "step" in r]
    return [s for s, _ in pairs], [v for _, v in pairs]


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` points (same length as `values`)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _draw(ax, steps: list[int], values: list[float], label: str, style: str, color) -> None:
    if len(values) >= SMOOTH_MIN_POINTS:
        ax.plot(steps, values, style, color=color, alpha=0.25, linewidth=0.8)
        window = max(2, len(values) // 20)
        ax.plot(steps, moving_average(values, window), style, color=color, label=label)
    else:
        ax.plot(steps, values, style, color=color, label=label, marker="." if len(values) < 50 else None)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def _new_axes(title: str, ylabel: str):
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write this run's PNGs into `run_dir/plots/`; returns their paths (absent curves skipped)."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    written = []
    for stem, title, ylabel, keys in CURVES:
        present = [(k, style) for k, style in keys if series(rows, k)[0]]
        if not present:
            continue
        fig, ax = _new_axes(f"{title}: {run_dir.name}", ylabel)
        for i, (key, style) in enumerate(present):
            _draw(ax, *series(rows, key), label=key, style=style, color=f"C{i}")
        ax.legend()
        written.append(_save(fig, run_dir / "plots" / f"{stem}.png"))
    return written


def _labels(run_dirs: list[Path]) -> list[str]:
    names = [d.name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{d.parent.name}/{d.name}" for d in run_dirs]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _fmt_wall(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_duration(seconds)


def final_values(rows: list[dict]) -> dict:
    """The table's numbers for one run: last eval values, mean responses per prompt, steps, wall."""
    def last(key):
        values = series(rows, key)[1]
        return values[-1] if values else None

    rpp = series(rows, "gen/responses_per_prompt")[1]
    return {
        "eval/avg@8": last("eval/avg@8"),
        "eval/pass@8": last("eval/pass@8"),
        "gen/responses_per_prompt_mean": sum(rpp) / len(rpp) if rpp else None,
        "steps": rows[-1].get("step") if rows else None,
        "wall_time_s": rows[-1].get("time_s") if rows else None,
    }


def markdown_table(labels: list[str], finals: list[dict]) -> str:
    header = ("| run | eval/avg@8 | eval/pass@8 | mean gen/responses_per_prompt | steps | wall time |\n"
              "|---|---:|---:|---:|---:|---:|\n")
    lines = [f"| {label} | {_fmt(f['eval/avg@8'])} | {_fmt(f['eval/pass@8'])} | "
             f"{_fmt(f['gen/responses_per_prompt_mean'], 2)} | "
             f"{'-' if f['steps'] is None else f['steps']} | {_fmt_wall(f['wall_time_s'])} |"
             for label, f in zip(labels, finals)]
    return header + "\n".join(lines) + "\n"


def compare_runs(run_dirs: list[str | Path], out_dir: str | Path) -> tuple[str, list[Path]]:
    """Overlay the runs' curves into `out_dir/compare_<curve>.png` (one color per run, one line
    style per key) and return (markdown table of final values, PNG paths). The table is also
    written to `out_dir/compare.md`."""
    run_dirs = [Path(d) for d in run_dirs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = _labels(run_dirs)
    all_rows = [read_metrics(d) for d in run_dirs]
    pngs = []
    for stem, title, ylabel, keys in CURVES:
        fig, ax = _new_axes(title, ylabel)
        drawn = 0
        for i, (label, rows) in enumerate(zip(labels, all_rows)):
            for key, style in keys:
                steps, values = series(rows, key)
                if steps:
                    name = label if len(keys) == 1 else f"{label} {key}"
                    _draw(ax, steps, values, label=name, style=style, color=f"C{i % 10}")
                    drawn += 1
        if drawn:
            ax.legend(fontsize="small")
            pngs.append(_save(fig, out_dir / f"compare_{stem}.png"))
    table = markdown_table(labels, [final_values(rows) for rows in all_rows])
    (out_dir / "compare.md").write_text(table)
    return table, pngs
