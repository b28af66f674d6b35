"""What a run does on SIGTERM and SIGINT (Ctrl-C): before its training begins, take back what the
start wrote; once training runs, checkpoint the current step and stop cleanly."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import jax


class Interrupted(KeyboardInterrupt):
    """A signal that stopped a run before its training began (``signum``: which)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted ({signal.Signals(signum).name}) before training began: "
                         "what this start wrote was taken back; run the same command to start "
                         "again")
        self.signum = signum


class Preemption:
    """SIGTERM (what schedulers send before preemption) and SIGINT (Ctrl-C, what a person at a
    terminal sends), for a whole run: ``with Preemption() as interrupts:``. While the run
    starts, a signal raises Interrupted, so FailedStart takes back what the start wrote. From
    ``interrupts.begin()`` (the start is complete) the first signal asks the loop to checkpoint
    the current step and stop cleanly (``with interrupts.training() as preempted: ...
    preempted()``; exit 0), and a second SIGINT stops at once: one line, exit 130, the committed
    checkpoints kept. Python runs handlers in the main thread, so the input pipeline's threads
    never see a KeyboardInterrupt. Across processes, SIGTERM is JAX's preemption service's
    (jax.distributed installs its handler; Orbax's reached_preemption gives every process the
    same step to save), and a first SIGINT in training is passed on to it as this process's
    own SIGTERM, so Ctrl-C on one process or on all saves one agreed step. An ignored signal
    (nohup) stays ignored."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        self.flag, self.asked, self.started, self.previous = False, False, False, {}
        self.saved = False
        # several processes: SIGTERM stays the preemption service's; without it, Ctrl-C keeps
        # Python's default (the processes could not agree on a step to save)
        self.shared = jax.process_count() > 1
        signals = (signal.SIGINT,) if self.shared else self.SIGNALS
        if self.shared and not jax.config.jax_enable_preemption_service:
            signals = ()
        if threading.current_thread() is threading.main_thread():
            for signum in signals:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def begin(self) -> None:
        self.started = True

    @contextlib.contextmanager
    def training(self):
        self.begin()
        yield lambda: self.flag

    def saving(self) -> None:
        """The loop saves its last step now: a signal that arrives late (its handler run after
        the processes agreed on the step) asks nothing more of the preemption service."""
        self.saved = True

    def _handle(self, signum, frame):
        if not self.started:
            raise Interrupted(signum)
        late = self.shared and self.saved          # the processes agreed on a step already
        if self.asked and signum == signal.SIGINT:
            sys.stderr.write("\nerror: interrupted again: stopped at once, without saving this "
                             "step; the committed checkpoints are kept: run the same command to "
                             "resume from the newest\n")
            sys.stderr.flush()
            os._exit(130)
        if not self.asked and signum == signal.SIGINT:
            sys.stderr.write("\ninterrupted: saving this step, then stopping (Ctrl-C again "
                             "stops at once)\n")
            sys.stderr.flush()
        self.asked = True
        if self.shared and not late:   # the service agrees with the other processes on a step
            os.kill(os.getpid(), signal.SIGTERM)
        elif not self.shared:
            self.flag = True

    def __exit__(self, *exc):
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        return False
