"""Orbax checkpoints of a run, saved asynchronously every N steps, the newest ``keep`` kept.

Each step holds three items: ``params`` (the weights alone, so evaluation and export restore
them without building an optimizer), ``optimizer`` (the step counter and optimizer state) and
``data`` (the input iterator's state, JSON). Restoring takes the shardings of the run that
restores, so a checkpoint written under one mesh/layout loads under another."""
from __future__ import annotations

import contextlib
import logging
import pathlib
import shutil
import threading

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from orbax.checkpoint._src.metadata import array_metadata_store     # as Orbax's own default

from switchzoo import integrity, workdir
from switchzoo.state import TrainState

# Orbax splits each replicated array among the replicas that hold it, so that each writes a
# slice ("replica-parallel"); every distinct slice is a small compiled program. For arrays
# under a few MiB that only costs compile time (80 programs, ~2 s, on the first save of a tiny
# model on 8 devices) and saves no writing time, so only larger arrays are split.
MIN_SLICE_BYTES = 4 << 20


@contextlib.contextmanager
def _quiet():
    """absl at ERROR: Orbax warns at every read-only manager that it is read-only."""
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(verbosity)


def _register_array_handler() -> None:
    with _quiet():                                 # not the "overriding jax.Array" warning
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(
                min_slice_bytes_for_replica_parallel=MIN_SLICE_BYTES,
                array_metadata_store=array_metadata_store.Store()), override=True)


_register_array_handler()


class _NoSpaceNoise(logging.Filter):
    """Orbax logs a full disk from each of its writing threads, with their tracebacks, and
    then the errors of cancelling the other writes ('Event loop is closed'); the run reports
    the fault once, in one line (Checkpoints._faults), so those records are dropped."""
    seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "orbax" not in record.pathname:
            return True
        error = record.exc_info[1] if record.exc_info else None
        if workdir.is_no_space(Exception(record.getMessage())) or \
                (error is not None and workdir.is_no_space(error)):
            _NoSpaceNoise.seen = True
            return False
        return not (_NoSpaceNoise.seen and record.levelno >= logging.ERROR)


logging.getLogger("absl").addFilter(_NoSpaceNoise())


def _target(abstract, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


class Checkpoints:
    def __init__(self, directory, every: int, keep: int = 3, use_async: bool = True,
                 writer: bool = False, read_only: bool = False):
        """``writer``: the run's one writer (it holds the workdir's lock, switchzoo.workdir),
        which removes the partial steps a killed run left; ``read_only``: a reader (eval.py)
        that creates, removes and writes nothing, so it may read a run while it trains."""
        self.directory = pathlib.Path(directory).resolve()
        self.saving, self.needed, self.closed = None, None, False
        # the step whose integrity record is owed once its save has finished (process 0 of a
        # manager that writes; switchzoo.integrity)
        self.recording = not read_only and jax.process_index() == 0
        self.unrecorded, self.hashing = None, None
        with _quiet() if read_only else contextlib.nullcontext():   # not Orbax's "read only"
            self.manager = self._manager(every, keep, use_async, writer, read_only)

    def _manager(self, every, keep, use_async, writer, read_only):
        return ocp.CheckpointManager(
            self.directory,
            # Every ``every`` steps only (Orbax's default also saves the first step it sees).
            options=ocp.CheckpointManagerOptions(save_decision_policy=ocp.checkpoint_managers
                                                 .FixedIntervalPolicy(max(every, 1)),
                                                 max_to_keep=keep,
                                                 enable_async_checkpointing=use_async,
                                                 create=not read_only, read_only=read_only,
                                                 cleanup_tmp_directories=writer))

    def latest_step(self) -> int | None:
        """The newest committed checkpoint (a partial one, cut off by a crash, is ignored)."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: TrainState, data_state: dict, force: bool = False) -> bool:
        """Starts saving (asynchronously) when ``step`` is due or ``force``; True if it did. A
        save that finds the disk full (this one, or the one before it) is a one-line error."""
        if not (force or self.manager.should_save(step)):
            return False
        self.wait()                 # the save before (Orbax waits for it too): its fault is its
        self.saving = step
        self._owe(step)
        self.needed = sum(x.nbytes for x in jax.tree.leaves((state.params, state.opt_state)))
        with self._faults():
            return self.manager.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(state.params),
                optimizer=ocp.args.StandardSave({"step": state.step,
                                                 "opt_state": state.opt_state}),
                data=ocp.args.JsonSave(data_state)), force=force)

    def check(self) -> None:
        """Raises now (not at the next save) if a save running in the background failed."""
        with self._faults():
            self.manager.check_for_errors()

    @contextlib.contextmanager
    def _faults(self):
        """A full disk during a save: the partial step is removed (the committed ones stay,
        restorable) and the run stops in one line saying how much a checkpoint needs."""
        try:
            yield
        except Exception as e:
            if not workdir.is_no_space(e):
                raise
            with contextlib.suppress(Exception):
                self.manager.wait_until_finished()
            with contextlib.suppress(Exception):
                self.manager.close()        # joins every writing thread: none writes after this
            self.closed = True
            # Removed only now: on a loaded machine a thread still finishing its part of the
            # failed save re-created files in a partial step removed before close().
            for partial in self.directory.glob("*orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)
            kept = sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())
            raise workdir.NoSpace(
                f"no space left on device writing checkpoint {self.saving} in {self.directory}:"
                f" it needs ~{workdir.size(self.needed)}, "
                f"{workdir.size(workdir.free_bytes(self.directory))} free there; the partial "
                "step was removed and "
                + (f"step {kept[-1]} is the newest committed checkpoint" if kept else
                   "no checkpoint had committed yet")
                + ": free some space and run the same command to resume") from None

    def save_params(self, step: int, params) -> None:
        """A checkpoint of the weights alone (an upcycled model: what init_from and evaluation
        restore; it cannot resume a run), written before this returns."""
        self._owe(step)
        self.manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)),
                          force=True)
        self.wait()

    def _owe(self, step: int) -> None:
        self._recorded()            # before this save can rotate the step being hashed away
        if self.recording:
            integrity.forget(self.directory, step)
            self.unrecorded = step

    def _record(self) -> None:
        """The integrity record of the save that has just finished (committed), hashed in a
        thread of its own while training goes on (the files are final once committed); the
        one before is waited for first, and close() waits for the last."""
        self._recorded()
        if self.unrecorded is not None:
            self.hashing = threading.Thread(target=integrity.write,
                                            args=(self.directory, self.unrecorded),
                                            name=f"integrity-{self.unrecorded}", daemon=True)
            self.hashing.start()
            self.unrecorded = None

    def _recorded(self) -> None:
        if self.hashing is not None:
            self.hashing.join()
            self.hashing = None

    def restore(self, step: int, abstract: TrainState, shardings: TrainState):
        """(TrainState with ``shardings``, data-iterator state) of checkpoint ``step``, its files
        first checked against its integrity record (integrity.DamagedCheckpoint)."""
        integrity.verify(self.directory, step)
        optimizer = {"step": abstract.step, "opt_state": abstract.opt_state}
        optimizer_sh = {"step": shardings.step, "opt_state": shardings.opt_state}
        out = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_target(abstract.params, shardings.params)),
            optimizer=ocp.args.StandardRestore(_target(optimizer, optimizer_sh)),
            data=ocp.args.JsonRestore()))
        return (TrainState(out.optimizer["step"], out.params, out.optimizer["opt_state"]),
                out.data)

    def restore_params(self, step: int, abstract_params, shardings):
        """The parameters of checkpoint ``step`` alone, in ``shardings`` (checked as
        ``restore``'s)."""
        integrity.verify(self.directory, step)
        out = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_target(abstract_params, shardings))))
        return out.params

    def wait(self) -> None:
        with self._faults():
            self.manager.wait_until_finished()
        self._record()

    def close(self) -> None:
        if self.closed:
            return
        with self._faults():
            self.manager.wait_until_finished()
        self._record()
        self._recorded()            # the run ends with every committed step recorded
        self.manager.close()
        self.closed = True
