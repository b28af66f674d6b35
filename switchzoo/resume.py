"""Which checkpoint a run resumes from (and eval.py evaluates), and one line when it cannot.

A checkpoint that does not restore is either damaged (files cut, overwritten or missing) or was
written for other settings (tensors of other shapes). Its Orbax metadata tells the two apart:
metadata that cannot be read, or that matches the run's abstract state tensor for tensor, means
damaged files. Then the older steps are tried, newest first, and the error names the newest one
that restores and how to start from it: ``--config.restore_step=N``.

``restore_step=N`` resumes from checkpoint N. The checkpoints after it are moved, not deleted,
to WORKDIR/checkpoints-after-N, where Orbax neither resumes from them nor overwrites nor deletes
them (they are the user's to inspect or remove); the run then saves and keeps its checkpoints
as usual. That directory also marks the choice as made: the same command run again (after a
preemption, say) resumes from the newest checkpoint instead of going back to N again.

Orbax restores in an event loop that it closes when one read fails; the reads still in flight
then post their completions to the closed loop, and Python reports each RuntimeError('Event loop
is closed') as an unraisable exception: dozens of tracebacks, some printed after the error
line. ``quiet_closed_loop`` drops exactly those.
"""
from __future__ import annotations

import os
import re
import sys

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from switchzoo.errors import one_line

# What Orbax and TensorStore raise for a checkpoint they cannot read or fit: a file cut short
# can surface as a bare Exception from deep inside Orbax, so every Exception (never a
# KeyboardInterrupt or SystemExit) of a restore is a checkpoint that did not restore, explained
# in one line (switchzoo.integrity's DamagedCheckpoint, a ValueError, among them).
RESTORE_ERRORS = (Exception,)


def quiet_closed_loop() -> None:
    """Drops the unraisable RuntimeError('Event loop is closed') of a failed restore's reads
    (see the module docstring); every other unraisable exception goes to the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "switchzoo_quiet", False):
        return

    def hook(unraisable):
        e = unraisable.exc_value
        if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
            previous(unraisable)
    hook.switchzoo_quiet = True
    sys.unraisablehook = hook


def aside_dir(ckpt, step: int):
    return ckpt.directory.parent / f"checkpoints-after-{step}"


def start_step(ckpt, restore_step: int | None) -> int | None:
    """The step the run will resume from: restore_step unless already applied, else the
    newest committed checkpoint (None: none)."""
    if restore_step is not None and not aside_dir(ckpt, restore_step).exists():
        return restore_step
    return ckpt.latest_step()


def _names(path) -> tuple:
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _shapes(tree) -> dict:
    return {_names(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def fits(ckpt, step: int, wanted: dict) -> bool | None:
    """Whether checkpoint ``step``'s metadata describes the tensors of ``wanted`` ({item:
    abstract tree}); None where it cannot be read."""
    try:
        with ocp.StandardCheckpointer() as reader:
            for item, abstract in wanted.items():
                tree = reader.metadata(ckpt.directory / str(step) / item).item_metadata.tree
                if _shapes(tree) != _shapes(abstract):
                    return False
    except (*RESTORE_ERRORS, AttributeError):
        return None
    return True


def reason(e: BaseException, ckpt) -> str:
    """A restore error's gist: the file TensorStore could not read and why, else the message."""
    text = one_line(e).split(" [tensorstore_spec")[0]
    files = re.findall(r'local file "([^"]+)"', text)
    if files:
        tail = text.rsplit(f'"{files[-1]}"', 1)[1].lstrip(": ")
        text = f"{os.path.relpath(files[-1], ckpt.directory)}: {tail}"
    return text[:240]


def explain(ckpt, step: int, e: BaseException, try_restore, wanted: dict, verb: str) -> str:
    """The one line for checkpoint ``step`` that failed with ``e``: other settings, or damaged
    files and the newest older step that ``try_restore(step)`` restores."""
    why = reason(e, ckpt)
    if fits(ckpt, step, wanted) is False:
        return (f"checkpoint {step} in {ckpt.directory} cannot be restored for this config: its "
                f"tensors are not this model's ({why}); it was left as it is: a --config "
                "setting that shapes the parameters (e.g. moe.balance, moe.num_shared_experts, "
                "scan_layers) may differ from the run's; use the run's settings or another "
                "--workdir")
    older = [s for s in ckpt.all_steps() if s < step]
    for s in reversed(older):
        try:
            try_restore(s)
        except RESTORE_ERRORS:
            continue
        then = (f"; the checkpoints after it are then kept in {aside_dir(ckpt, s)}"
                if verb == "resume" else "")
        return (f"checkpoint {step} in {ckpt.directory} is damaged ({why}); step {s} is the "
                f"newest that restores: {verb} from it with --config.restore_step={s} "
                f"(nothing was deleted{then})")
    return (f"checkpoint {step} in {ckpt.directory} is damaged ({why}) and "
            f"{'no older step restores' if older else 'there is no older step'}; nothing was "
            "changed: restore checkpoints/ from a copy of the run, or start a new --workdir")


def chosen_step(ckpt, restore_step: int | None, say=print, once: bool = True) -> int | None:
    """The checkpoint to restore: restore_step (checked to exist) unless ``once`` and already
    applied (a run's resume), else the newest; None where there is none."""
    quiet_closed_loop()         # before a restore that may fail
    steps = ckpt.all_steps()
    if once and restore_step is not None and aside_dir(ckpt, restore_step).exists():
        say(f"restore_step={restore_step} was applied before (the checkpoints after it are in "
            f"{aside_dir(ckpt, restore_step)}): resuming from the newest checkpoint, "
            f"step {steps[-1] if steps else None}")
        restore_step = None
    if restore_step is not None and restore_step not in steps:
        raise ValueError(f"--config.restore_step={restore_step}: {ckpt.directory} holds no "
                         f"checkpoint {restore_step} (its steps: "
                         f"{', '.join(map(str, steps)) or 'none'}); give one of them")
    return restore_step if restore_step is not None else (steps[-1] if steps else None)


ROTATION_RETRIES = 3         # choices of the newest step when a live run deletes the chosen one


def read_newest(ckpt, pinned: int | None, load, explain_fault):
    """(step, load(step)) of the newest committed checkpoint, or of ``pinned``; (None, None)
    where there is none. A run training in the directory meanwhile may commit a newer step and
    rotate the chosen one away (keep_checkpoints) while it is read, its directory gone or half
    deleted: unpinned, a read that fails once a newer step has committed is retried on the
    newest; a pinned step that vanished is one line. Any other fault:
    ValueError(explain_fault(step, e))."""
    for attempt in range(ROTATION_RETRIES + 1):
        step = chosen_step(ckpt, pinned, once=False)
        if step is None:
            return None, None
        try:
            return step, load(step)
        except RESTORE_ERRORS as e:
            ckpt.manager.reload()               # what the run committed or removed meanwhile
            steps = ckpt.all_steps()
            if pinned is None and steps and steps[-1] > step and attempt < ROTATION_RETRIES:
                continue
            if (ckpt.directory / str(step)).exists() and step in steps:
                raise ValueError(explain_fault(step, e)) from e
            raise ValueError(
                f"checkpoint {step} in {ckpt.directory} was removed while it was read (a run "
                "training there rotates its checkpoints: keep_checkpoints); "
                + ("pin a step it keeps with --config.restore_step, or " if pinned is not None
                   else "") + "run the same command again") from e


def restore(ckpt, setup, restore_step: int | None = None, say=print):
    """(TrainState, data-iterator state) of the chosen checkpoint (None where the workdir has
    none); the checkpoints after restore_step set aside. ValueError in one line where the
    checkpoint does not restore."""
    step = chosen_step(ckpt, restore_step, say)
    if step is None:
        return None

    def load(s):
        return ckpt.restore(s, setup.abstract, setup.shardings)
    try:
        out = load(step)
    except RESTORE_ERRORS as e:
        wanted = {"params": setup.abstract.params,
                  "optimizer": {"step": setup.abstract.step,
                                "opt_state": setup.abstract.opt_state}}
        raise ValueError(explain(ckpt, step, e, load, wanted, "resume")) from e
    newer = [s for s in ckpt.all_steps() if s > step]
    if newer:
        aside = aside_dir(ckpt, step)
        if jax.process_index() == 0:
            aside.mkdir()
            for s in newer:
                os.rename(ckpt.directory / str(s), aside / str(s))
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("switchzoo: checkpoints set aside")
        ckpt.manager.reload()
        say(f"restore_step={step}: resuming from step {step}; the newer checkpoints "
            f"({', '.join(map(str, newer))}) are kept in {aside}, not resumed from")
    return out
