"""PNG plots of one run, drawn by the learner at the end of the run (and by `rlvr plot`).

What: `plot_run(run_dir)` draws the run's curves into `run_dir/plots/`. It reads only
`metrics.jsonl` (see `learner/run_log.py`), so it works on finished, crashed or running runs.
Comparing several runs (`rlvr compare`, `rlvr sweep`) is rlvr/compare.py, which draws with the
helpers here (`series`, `draw`, `new_axes`, `save_png`).

Curves (keys from docs/ALGORITHMS.md section 9), each skipped when none of its keys was logged:
  reward.png                reward/acc_mean (solid), reward/train_mean (dashed) vs step
  eval.png                  eval/avg@8 (solid), eval/pass@8 (dashed) vs step (held-out accuracy)
  responses_per_prompt.png  gen/responses_per_prompt vs step (the sample cost per prompt)
Noisy per-step curves are drawn faint with a moving average on top.

Why no pyplot: `matplotlib.figure.Figure` renders with Agg and touches no global backend state,
so plotting inside the learner process or a test never opens a window or fights another user.

Run: `python -c "from learner.plots import plot_run; print(plot_run('runs/x'))"`.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from learner.progress import is_scalar
from learner.run_log import read_metrics

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


def draw(ax, steps: list[int], values: list[float], label: str, style: str, color) -> None:
    if len(values) >= SMOOTH_MIN_POINTS:
        ax.plot(steps, values, style, color=color, alpha=0.25, linewidth=0.8)
        window = max(2, len(values) // 20)
        ax.plot(steps, moving_average(values, window), style, color=color, label=label)
    else:
        ax.plot(steps, values, style, color=color, label=label, marker="." if len(values) < 50 else None)


def save_png(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def new_axes(title: str, ylabel: str):
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
        fig, ax = new_axes(f"{title}: {run_dir.name}", ylabel)
        for i, (key, style) in enumerate(present):
            draw(ax, *series(rows, key), label=key, style=style, color=f"C{i}")
        ax.legend()
        written.append(save_png(fig, run_dir / "plots" / f"{stem}.png"))
    return written
