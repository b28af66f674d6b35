"""A study's runs as a Markdown table: the columns the studies share (harness.collect's summary
keys, formatted one way) and ``markdown`` that lays them out, a row per run."""
from __future__ import annotations

from typing import Callable, Sequence


def markdown(result: dict, columns: Sequence[tuple[str, Callable[[str, dict], object]]]) -> str:
    """The study's runs as a Markdown table, a row per run: ``columns`` are (header,
    cell(name, summary)); a cell of None prints as a dash."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for name, r in result["runs"].items():
        cells = (cell(name, r) for _, cell in columns)
        lines.append("| " + " | ".join("—" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def _reach(r: dict) -> str | None:
    if "steps_to_baseline_final_loss" not in r:
        return None
    frac = r["fraction_of_baseline_steps"]
    return "not reached" if frac is None else f"{r['steps_to_baseline_final_loss']} ({frac:.2f})"


def signed(value, sign: float = 1.0) -> str | None:
    return None if value is None else f"{sign * value:+.4f}"


# The columns the studies share (harness.markdown's): the summaries' keys, formatted one way.
COLUMNS = {
    "run": ("run", lambda n, r: n + ("" if r.get("finished", True) else " (unfinished)")),
    "model": ("model", lambda n, r: r["model"]),
    "params": ("params", lambda n, r: f"{r['parameters'] / 1e6:.2f}M"),
    "seed": ("seed", lambda n, r: r["seed"]),
    "tokens": ("tokens", lambda n, r: f"{r['tokens_seen'] / 1e6:.1f}M"),
    "loss": ("final held-out loss", lambda n, r: f"{r['final_eval_loss']:.4f}"),
    "neg_log_perp": ("eval neg. log perp. (↑)", lambda n, r: f"{-r['final_eval_loss']:.4f}"),
    "vs_baseline": ("vs baseline", lambda n, r: signed(r.get("eval_loss_minus_baseline"))),
    "reach": ("steps to baseline's final loss", lambda n, r: _reach(r)),
    "accuracy": ("eval accuracy", lambda n, r: r["final_accuracy"]),
    "train_ce": ("train CE, last interval",
                 lambda n, r: r["train_cross_entropy_last_interval"]),
    "load": ("max/mean expert load (eval)",
             lambda n, r: r.get("max_over_mean_expert_load_eval")),
    "tokens_per_sec": ("tokens/s", lambda n, r: round(r["tokens_per_sec"])
                       if r.get("tokens_per_sec") else None),
}


