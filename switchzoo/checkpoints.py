"""Orbax checkpoints of a run: train state + data-iterator state, saved asynchronously every N
steps, the newest ``keep`` kept. Restoring takes the shardings of the run that restores, so a
checkpoint written under one mesh/layout loads under another."""
from __future__ import annotations

import pathlib

import jax
import orbax.checkpoint as ocp


class Checkpoints:
    def __init__(self, directory, every: int, keep: int = 3, use_async: bool = True):
        self.directory = pathlib.Path(directory).resolve()
        self.manager = ocp.CheckpointManager(
            self.directory,
            # Every ``every`` steps only (Orbax's default also saves the first step it sees).
            options=ocp.CheckpointManagerOptions(save_decision_policy=ocp.checkpoint_managers
                                                 .FixedIntervalPolicy(max(every, 1)),
                                                 max_to_keep=keep,
                                                 enable_async_checkpointing=use_async,
                                                 create=True))

    def latest_step(self) -> int | None:
        """The newest committed checkpoint (a partial one, cut off by a crash, is ignored)."""
        return self.manager.latest_step()

    def save(self, step: int, state, data_state: dict, force: bool = False) -> bool:
        """Starts saving (asynchronously) when ``step`` is due or ``force``; True if it did."""
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=force)

    def restore(self, step: int, abstract_state, shardings):
        """(state with ``shardings``, data-iterator state) of checkpoint ``step``."""
        target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                              abstract_state, shardings)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
        return out.state, out.data

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
