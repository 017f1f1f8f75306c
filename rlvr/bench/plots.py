"""PNG plots of `rlvr bench` results (matplotlib's Figure with Agg, as learner/plots.py: no
pyplot, no global backend state).

Efficiency: `efficiency_responses.png` (responses per step, mean and spread over seeds, per
algorithm), `efficiency_accuracy_vs_responses.png` (held-out eval/avg@8 against cumulative
responses generated, one line per run: the curve further left is the cheaper one) and
`efficiency_responses_per_step.png` (responses generated per step against step, seed 0).
Throughput: `throughput.png` (steps per minute per mode with the overlap bound's prediction) and
`throughput_busy.png` (learner and actor busy fractions per mode).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from rlvr.bench.run_metrics import EVAL_AVG, accuracy_by_responses, is_number, training_rows
from learner.plots import series


def _axes(title: str, xlabel: str, ylabel: str):
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def _bars(ax, labels: list[str], heights: list, errors: list | None = None) -> None:
    heights = [h if is_number(h) else 0.0 for h in heights]
    errors = [e if is_number(e) else 0.0 for e in errors] if errors else None
    ax.bar(range(len(labels)), heights, yerr=errors, capsize=4, color=[f"C{i}" for i in
                                                                      range(len(labels))])
    ax.set_xticks(range(len(labels)), labels)


def plot_efficiency(rows_by_algorithm: dict[str, list[list[dict]]], results: dict,
                    out_dir: Path) -> list[Path]:
    names = list(rows_by_algorithm)
    algos = results["algorithms"]
    fig, ax = _axes("Responses generated per step (mean ± std over seeds)", "algorithm",
                    "responses / step")
    _bars(ax, names, [algos[n]["responses_per_step"]["mean"] for n in names],
          [algos[n]["responses_per_step"]["std"] for n in names])
    paths = [_save(fig, out_dir / "efficiency_responses.png")]

    fig, ax = _axes("Held-out accuracy against responses generated", "responses generated",
                    EVAL_AVG)
    for i, name in enumerate(names):
        for seed, rows in enumerate(rows_by_algorithm[name]):
            points = accuracy_by_responses(rows)
            xs, ys = [p[1] for p in points], [p[2] for p in points]
            ax.plot(xs, ys, "-", marker=".", color=f"C{i}", alpha=1.0 if seed == 0 else 0.4,
                    label=name if seed == 0 else None)
    if is_number(results.get("target_acc")):
        ax.axhline(results["target_acc"], color="gray", linestyle=":", label="target")
    ax.legend(fontsize="small")
    paths.append(_save(fig, out_dir / "efficiency_accuracy_vs_responses.png"))

    fig, ax = _axes("Responses generated per step (seed 0; DAPO's filtered groups included)",
                    "step", "responses / step")
    for i, name in enumerate(names):
        steps, ys = series(training_rows(rows_by_algorithm[name][0]), "gen/responses_per_step")
        ax.plot(steps, ys, "-", color=f"C{i}", label=name)
    ax.legend(fontsize="small")
    paths.append(_save(fig, out_dir / "efficiency_responses_per_step.png"))
    return paths


def plot_throughput(results: dict, out_dir: Path) -> list[Path]:
    modes = results["modes"]
    names = list(modes)
    fig, ax = _axes("Training steps per minute (steady window)", "mode", "steps / min")
    _bars(ax, names, [modes[m]["steps_per_min"] for m in names])
    predicted = results["overlap"].get("predicted_steps_per_min")
    if is_number(predicted):
        ax.axhline(predicted, color="gray", linestyle=":", label="perfect overlap: 60 / max(G, T)")
        ax.legend(fontsize="small")
    paths = [_save(fig, out_dir / "throughput.png")]

    fig, ax = _axes("Busy fractions", "mode", "fraction of wall time")
    width = 0.4
    for k, (key, label) in enumerate([("learner_busy_frac", "learner"),
                                      ("actor_busy_frac", "actors")]):
        heights = [modes[m][key] if is_number(modes[m][key]) else 0.0 for m in names]
        ax.bar([i + (k - 0.5) * width for i in range(len(names))], heights, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    paths.append(_save(fig, out_dir / "throughput_busy.png"))

    hists = {m: modes[m]["len_generated"] for m in names if modes[m].get("len_generated")}
    if hists:
        fig, ax = _axes("Generated response lengths (steady window)", "tokens",
                        "share of responses")
        for m, h in hists.items():
            edges = [i * h["bin_width"] for i in range(len(h["counts"]) + 1)]
            ax.stairs([c / h["n"] for c in h["counts"]], edges, label=m)
        ax.set_yscale("log")
        ax.legend(fontsize="small")
        paths.append(_save(fig, out_dir / "throughput_lengths.png"))
    return paths
