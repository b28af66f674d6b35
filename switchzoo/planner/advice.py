"""What to change when no layout fits: the layout search's one advice builder.

Each change is written in the flags of the command that asked (``python -m switchzoo.layout
search`` or ``train.py --search_layout``), and is offered only where the search's own estimate
(switchzoo/planner/estimate.py) puts it under the budget: the compiled peak moved by the
estimate's change in state and activations, or before compiling, the state (the bound pruning
uses). More micro-batches, full remat, bfloat16 activations and more devices are the changes it
weighs, one at a time.
"""
from __future__ import annotations

import dataclasses

from switchzoo.planner.candidates import DIMS, Candidate
from switchzoo.planner.estimate import Model

GIB = 2 ** 30
MAX_DEVICES = 64            # devices advice: up to this many times the devices asked for

FLAGS = {
    "search": {"accumulate": "--grad-accum {k}", "remat": "--remat full",
               "dtype": "--dtype bfloat16", "devices": "--devices {n} --batch {batch}"},
    "train": {"accumulate": "--config.grad_accum_steps={k}", "remat": "--config.remat=full",
              "dtype": "--config.dtype=bfloat16",
              "devices": "--devices={n} --config.per_device_batch_size={per_device}"},
}


@dataclasses.dataclass(frozen=True)
class Change:
    flags: str              # as the command takes them
    model: Model            # the run with the change
    cand: Candidate         # the layout it was weighed on
    peak: float             # the estimated peak (or state, before compiling) per device


def estimated_peak(model: Model, cand: Candidate, peak: float | None, changed: Model,
                   changed_cand: Candidate) -> float:
    """The search's estimate of a changed run's peak per device: a compiled ``peak`` moved by
    the estimate's difference in state and activations; with no compiled peak, the state."""
    if peak is None:
        return changed.state_bytes(changed_cand)
    return (peak + changed.state_bytes(changed_cand) - model.state_bytes(cand)
            + changed.activation_bytes(changed_cand) - model.activation_bytes(cand))


def gib_text(b: float) -> str:
    return f"{b / GIB:.1f} GiB" if b >= GIB / 10 else f"{b / 2 ** 20:.1f} MiB"


def _divides(model: Model, c: Candidate) -> Candidate | None:
    """``c`` (a pipeline's micro-batches chosen afresh) where the run's sizes divide over it."""
    sizes = model.sizes()
    if all(sizes.of(d) % c.parts(d) == 0 for d in DIMS if d != "experts" or sizes.experts):
        return model.pipelined(c)
    return None


def _more_devices(model: Model, cand: Candidate, peak: float | None, n: int, budget: float,
                  spelling: dict) -> Change | None:
    """The fewest devices (n x 2^j) on which the estimate fits: each doubling doubles the
    mesh axis that lowers the estimate most; the global batch stays where the command can
    keep it (else the per-device batch does)."""
    cur, m, changed = cand, n, model
    while m < MAX_DEVICES * n:
        m *= 2
        per_device = model.batch // m if model.batch % m == 0 else model.batch // n
        changed = dataclasses.replace(model, batch=per_device * m)
        if "{batch}" in spelling["devices"] and model.batch % m:
            return None                      # --batch must split over the devices
        best = None
        for axis, size in cur.mesh:
            if not any(axis in a for _, a in cur.rules):
                continue
            c = _divides(changed, dataclasses.replace(
                cur, mesh=tuple((a, s * 2 if a == axis else s) for a, s in cur.mesh)))
            if c is not None:
                est = estimated_peak(model, cand, peak, changed, c)
                if best is None or est < best[0]:
                    best = (est, c)
        if best is None:
            return None
        est, cur = best
        if est <= budget:
            flags = spelling["devices"].format(n=m, batch=changed.batch, per_device=per_device)
            return Change(flags, changed, cur, est)
    return None


def changes(model: Model, cand: Candidate, budget: float, n: int, peak: float | None = None,
            spelling: str = "search") -> list[Change]:
    """Every change the search estimates to fit ``budget`` from ``cand`` on ``n`` devices
    (``peak``: its compiled peak; None: before compiling, where only the state counts)."""
    flags = FLAGS[spelling]
    out = []

    def weigh(text: str, changed: Model, c: Candidate = cand) -> bool:
        est = estimated_peak(model, cand, peak, changed, c)
        if est <= budget:
            out.append(Change(text, changed, c, est))
        return est <= budget

    k = 2
    micro = cand.microbatches if cand.stages > 1 else 1     # a pipeline's, within each
    while model.batch % (model.accumulate * k * cand.parts("batch") * micro) == 0:
        if weigh(flags["accumulate"].format(k=model.accumulate * k),
                 dataclasses.replace(model, accumulate=model.accumulate * k)):
            break
        k *= 2
    if model.remat != "full":
        weigh(flags["remat"], dataclasses.replace(model, remat="full"))
    if model.act_bytes == 4:
        weigh(flags["dtype"], dataclasses.replace(model, act_bytes=2))
    more = _more_devices(model, cand, peak, n, budget, flags)
    if more:
        out.append(more)
    return out


def advise(model: Model, cand: Candidate, budget: float, n: int, peak: float | None = None,
           spelling: str = "search") -> str:
    """One line: what is over the budget, and each change estimated to fit, with its estimate."""
    if peak is None:
        head = (f"no layout on {n} devices fits {gib_text(budget)} per device: the smallest state "
                f"(parameters, gradients, optimizer) is {gib_text(model.state_bytes(cand))} "
                f"({cand.mesh_text} {cand.layout_text})")
    else:
        head = f"the lowest peak is {gib_text(peak)} ({cand.mesh_text} {cand.layout_text})"
    found = changes(model, cand, budget, n, peak, spelling)
    if not found:
        tried = ", ".join(f.split(" ")[0].split("=")[0] for f in FLAGS[spelling].values())
        return f"{head}; no single change the search weighs ({tried}) is estimated to fit"
    what = "state" if peak is None else "peak"
    return f"{head}; estimated to fit: " + "; ".join(
        f"{c.flags} ({what} ~{gib_text(c.peak)}"
        + (f" on {c.cand.mesh_text}" if c.cand.mesh != cand.mesh else "") + ")" for c in found)
