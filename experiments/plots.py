"""The studies' plots: held-out loss against step, one panel per group of runs, and the routers'
curves (entropy, confidence, logit std) per run and Switch layer. Read harness.collect's result
dict; write a PNG."""
from __future__ import annotations

import pathlib
from typing import Sequence

ROUTING = ("router_confidence", "router_entropy", "router_logit_std")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_curves(result: dict, path: pathlib.Path, groups: dict[str, Sequence[str]] | None = None,
                ylabel: str = "held-out loss (nats per token, lower is better)",
                offsets: dict[str, int] | None = None,
                xlabel: str = "training step") -> None:
    """Eval loss against step, one panel per group of runs (default: every run in one);
    ``offsets``: steps added to a run's (a continuation drawn from the step it starts at)."""
    plt = _pyplot()
    groups = groups or {result["study"]: list(result["runs"])}
    groups = {t: [n for n in names if n in result["runs"]] for t, names in groups.items()}
    groups = {t: names for t, names in groups.items() if names}
    offsets = offsets or {}
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups.items()):
        for i, name in enumerate(names):
            r = result["runs"][name]
            ax.plot([s + offsets.get(name, 0) for s in r["steps"]], r["eval_loss"], marker="o",
                    ms=2.5, lw=1.2, color=f"C{i % 10}",
                    ls="--" if r["model"].startswith(("dense", "t5")) else "-",
                    label=f"{name} ({r['final_eval_loss']:.3f})")
        finals = [result["runs"][n]["final_eval_loss"] for n in names]
        ax.set_ylim(min(finals) - 0.1, min(finals) + 1.0)
        _label(ax, xlabel, ylabel, title)
    _save(plt, fig, path)


def _label(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save(plt, fig, path: pathlib.Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_router_curves(result: dict, path: pathlib.Path) -> bool:
    """Router entropy, confidence (mean top probability) and logit std against step, per run
    and Switch layer: how far routing has left uniform. False (and no file) without routed
    runs."""
    curves = {n: r["router_curves"] for n, r in result["runs"].items()
              if r.get("router_curves") and r["router_curves"]["router_entropy"][-1]}
    if not curves:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(ROUTING), figsize=(14, 3.8))
    for ax, key in zip(axes, ROUTING):
        for i, (name, c) in enumerate(curves.items()):
            logged = [(s, v) for s, v in zip(c["step"], c[key]) if v is not None]
            for layer in range(len(logged[-1][1])):
                ax.plot([s for s, _ in logged], [v[layer] for _, v in logged],
                        color=f"C{i % 10}", lw=1, ls=("-", "--", ":", "-.")[layer % 4],
                        label=f"{name}, Switch layer {layer}")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    _save(plt, fig, path)
    return True


def plot_fractions(series: dict[str, Sequence[Sequence]], path: pathlib.Path,
                   goal: float | None = 2 / 3, title: str = "") -> None:
    """Each series' [budget, fraction] points (verdicts.fraction_by_budget: the share of the
    baseline's steps a run needs to reach the baseline's loss at that budget), one line each,
    with the goal as a horizontal line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (name, points) in enumerate(series.items()):
        pts = [(s, f) for s, f in points if f is not None]
        ax.plot([s for s, _ in pts], [f for _, f in pts], marker="o", ms=2.5, lw=1.2,
                color=f"C{i % 10}", label=name)
    if goal is not None:
        ax.axhline(goal, color="k", lw=0.8, ls=":", label=f"goal {goal:.3g}")
    _label(ax, "the baseline's steps (budget)",
           "fraction of the baseline's steps to reach its loss", title)
    _save(plt, fig, path)


def plot_train_and_held_out(series: dict[str, dict], path: pathlib.Path, title: str = "") -> None:
    """Per pair (verdicts.train_and_held_out): left, the run minus its baseline on held-out loss
    (solid) and on training cross-entropy (dashed); right, each one's held-out minus training
    loss (the run solid, its baseline dashed). A held-out gap that turns against the run while
    the training gap does not is the run fitting the repeated text faster."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (name, c) in enumerate(series.items()):
        colour = f"C{i % 10}"
        axes[0].plot(c["steps"], c["held_out_minus_baseline"], color=colour, lw=1.2,
                     label=f"{name}: held-out")
        axes[0].plot(c["steps"], c["train_minus_baseline"], color=colour, lw=1, ls="--",
                     label=f"{name}: training")
        axes[1].plot(c["steps"], c["generalisation_gap"], color=colour, lw=1.2, label=name)
        axes[1].plot(c["steps"], c["baseline_generalisation_gap"], color=colour, lw=1, ls="--",
                     label=f"{name}'s baseline")
    axes[0].axhline(0, color="k", lw=0.8, ls=":")
    _label(axes[0], "training step", "run minus baseline (nats; below 0: run ahead)", title)
    _label(axes[1], "training step", "held-out minus training loss (nats)",
           "generalisation gap")
    _save(plt, fig, path)


def plot_bars(values: dict[str, dict[str, float]], path: pathlib.Path, ylabel: str,
              title: str = "", log: bool = False) -> None:
    """Grouped bars: one group per key of the inner dicts (in first-seen order), one bar per
    series (the outer keys) in each."""
    plt = _pyplot()
    groups = list(dict.fromkeys(g for series in values.values() for g in series))
    width = 0.8 / max(len(values), 1)
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(groups) * max(len(values), 1) / 2), 4.5))
    for i, (name, series) in enumerate(values.items()):
        xs = [j + (i - (len(values) - 1) / 2) * width for j, g in enumerate(groups) if g in series]
        ax.bar(xs, [series[g] for g in groups if g in series], width, label=name,
               color=f"C{i % 10}", hatch="//" if name.startswith("dense") else None)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    _save(plt, fig, path)
