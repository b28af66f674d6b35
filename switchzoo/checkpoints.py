"""Orbax checkpoints of a run, saved asynchronously every N steps, the newest ``keep`` kept.

Each step holds three items: ``params`` (the weights alone, so evaluation and export restore
them without building an optimizer), ``optimizer`` (the step counter and optimizer state) and
``data`` (the input iterator's state, JSON). Restoring takes the shardings of the run that
restores, so a checkpoint written under one mesh/layout loads under another."""
from __future__ import annotations

import pathlib

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from orbax.checkpoint._src.metadata import array_metadata_store     # as Orbax's own default

from switchzoo.state import TrainState

# Orbax splits each replicated array among the replicas that hold it, so that each writes a
# slice ("replica-parallel"); every distinct slice is a small compiled program. For arrays
# under a few MiB that only costs compile time (80 programs, ~2 s, on the first save of a tiny
# model on 8 devices) and saves no writing time, so only larger arrays are split.
MIN_SLICE_BYTES = 4 << 20


def _register_array_handler() -> None:
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)     # not the "overriding jax.Array" warning
    try:
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(
                min_slice_bytes_for_replica_parallel=MIN_SLICE_BYTES,
                array_metadata_store=array_metadata_store.Store()), override=True)
    finally:
        absl_logging.set_verbosity(verbosity)


_register_array_handler()


def _target(abstract, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


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

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: TrainState, data_state: dict, force: bool = False) -> bool:
        """Starts saving (asynchronously) when ``step`` is due or ``force``; True if it did."""
        return self.manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            optimizer=ocp.args.StandardSave({"step": state.step, "opt_state": state.opt_state}),
            data=ocp.args.JsonSave(data_state)), force=force)

    def save_params(self, step: int, params) -> None:
        """A checkpoint of the weights alone (an upcycled model: what init_from and evaluation
        restore; it cannot resume a run), written before this returns."""
        self.manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)),
                          force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, abstract: TrainState, shardings: TrainState):
        """(TrainState with ``shardings``, data-iterator state) of checkpoint ``step``."""
        optimizer = {"step": abstract.step, "opt_state": abstract.opt_state}
        optimizer_sh = {"step": shardings.step, "opt_state": shardings.opt_state}
        out = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_target(abstract.params, shardings.params)),
            optimizer=ocp.args.StandardRestore(_target(optimizer, optimizer_sh)),
            data=ocp.args.JsonRestore()))
        return (TrainState(out.optimizer["step"], out.params, out.optimizer["opt_state"]),
                out.data)

    def restore_params(self, step: int, abstract_params, shardings):
        """The parameters of checkpoint ``step`` alone, in ``shardings``."""
        out = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_target(abstract_params, shardings))))
        return out.params

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
