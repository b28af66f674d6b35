"""What the command lines (commands/train.py, commands/eval.py) share: absl flag parsing with a
bad flag or config as a one-line error (exit status 2), the distributed flags and
jax.distributed, user mistakes as 'error: ...' lines. A command-line module: the library never
imports it (it imports switchzoo.errors, whose one_line and bad_flag it re-exports)."""
from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time

from absl import flags

from switchzoo import registry, workdir
from switchzoo.errors import bad_flag, one_line  # noqa: F401  (the commands call cli.bad_flag)


def _packaged_configs(argv: list[str]) -> list[str]:
    """Each --config=FILE[:variant] resolved by registry.config_path."""
    out = []
    for arg in argv:
        if arg.startswith("--config="):
            path, sep, variant = arg[len("--config="):].partition(":")
            arg = f"--config={registry.config_path(path)}{sep}{variant}"
        out.append(arg)
    return out


def parse_flags(argv):
    """absl's parser, with a bad --config file or override as a one-line error."""
    try:
        argv = flags.FLAGS(_packaged_configs(argv))
        if flags.FLAGS["config"].value is not None or flags.FLAGS["config"].present:
            flags.FLAGS.config.to_dict()    # the config file loads lazily: load it now
        return argv
    except (flags.Error, AttributeError, ValueError, TypeError, OSError) as e:
        bad_flag(flag_error(e))


# ml_collections' words for a config file whose get_config raised (it then holds the traceback)
_WRAPPED = "Error whilst parsing config file:"
# absl's words when a --config.FIELD=value override does not convert: the field's kind
_CONVERSIONS = (("invalid literal for int()", "a valid int"),
                ("could not convert string to float", "a valid float"),
                ("Non-boolean argument to boolean flag", "true/false/1/0"))


def flag_error(e: BaseException) -> str:
    """One line for a bad flag: the config file's own error where ml_collections wrapped it in
    its traceback (``--config=FILE:variant``), and a ``--config.FIELD=value`` that does not
    convert in set_field's words ("config field FIELD='value' is not a valid int")."""
    seen, x = set(), e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if str(x).startswith(_WRAPPED) and x.__context__ is not None:
            return one_line(x.__context__)
        x = x.__cause__ or x.__context__
    text = one_line(e)
    override = re.match(r"flag --config\.([\w.]+)=(.*?): (.*)$", text)
    if override:
        field, value, why = override.groups()
        for words, kind in _CONVERSIONS:
            if words in why:
                return f"config field {field}='{value}' is not {kind}"
    return text


def define_distributed_flags() -> None:
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process "
                        "runs (else $JAX_COORDINATOR_ADDRESS; on TPU pods and SLURM JAX finds it)")
    flags.DEFINE_integer("num_processes", None, "Processes in the run (else from the environment).")
    flags.DEFINE_integer("process_id", None, "This process's index (else from the environment).")
    flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with what the "
                      "environment provides (TPU pod slices, SLURM).")
    flags.DEFINE_integer("coordinator_timeout", 300, "Seconds to wait for the coordinator "
                         "(process 0) to answer and for every process to join.")


PROCESS = ""        # "process i/P: " once this process is one of several (prefixes errors)
DISTRIBUTED_FLAGS = ("coordinator_address", "num_processes", "process_id", "distributed",
                     "coordinator_timeout")


def refuse_distributed_flags(why: str) -> None:
    """A distributed flag given where the command runs in one process is a bad flag."""
    given = [f"--{name}" for name in DISTRIBUTED_FLAGS if flags.FLAGS[name].present]
    if given:
        bad_flag(f"{', '.join(given)}: {why} runs in one process; drop "
                 f"{'it' if len(given) == 1 else 'them'}")


def initialize_distributed() -> None:
    """JAX's own multi-host runtime: one jax.distributed.initialize before any computation.
    JAX aborts a process whose coordinator never answers (a fatal log, no exception), so a
    process other than 0 first waits for the coordinator's port itself and fails in one line."""
    global PROCESS
    f = flags.FLAGS
    address = f.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not (address or f.distributed or (f.num_processes or 1) > 1):
        return
    if f.num_processes is not None and f.process_id is not None:
        if not 0 <= f.process_id < f.num_processes:
            raise ValueError(f"--process_id={f.process_id} is not one of the "
                             f"{f.num_processes} processes (0..{f.num_processes - 1})")
        PROCESS = f"process {f.process_id}/{f.num_processes}: "
    if f.coordinator_timeout < 1:
        raise ValueError(f"--coordinator_timeout={f.coordinator_timeout}: give seconds >= 1")
    if address and f.process_id:
        wait_for_coordinator(address, f.coordinator_timeout)
    import jax
    # CPU collectives across processes (no effect on GPU/TPU backends).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=f.num_processes,
                                   process_id=f.process_id,
                                   initialization_timeout=f.coordinator_timeout)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"jax.distributed.initialize failed ({one_line(e)}); give "
                         "--coordinator_address=HOST:PORT, --num_processes and --process_id, or "
                         "run where JAX finds them (TPU pods, SLURM)") from e
    PROCESS = f"process {jax.process_index()}/{jax.process_count()}: "


def wait_for_coordinator(address: str, timeout: float, connect=socket.create_connection,
                         clock=time.monotonic, sleep=time.sleep) -> None:
    """Returns once ``address`` (host:port) accepts a connection; a ValueError after
    ``timeout`` seconds of refusals."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--coordinator_address={address}: write it as HOST:PORT "
                         "(process 0's host and a free port)")
    deadline = clock() + timeout
    while True:
        try:
            connect((host.strip("[]"), int(port)), timeout=5).close()
            return
        except OSError as e:
            if clock() >= deadline:
                raise ValueError(
                    f"no coordinator answers at {address} after {timeout:g} s "
                    f"({e.strerror or e}): start process 0 (it serves the coordinator) with "
                    "the same --coordinator_address, or correct the address") from e
            sleep(0.5)


def run(fn, verbose_flag: str = "verbose") -> None:
    """Calls ``fn()``; user mistakes and filesystem faults (a full disk, a read-only
    directory: switchzoo.workdir) become 'error: ...' on stderr and exit status 2; an
    interrupt (Ctrl-C where the run does not take it as a preemption) one line and 128 + the
    signal's number."""
    try:
        fn()
    except (ValueError, KeyError, FileNotFoundError, FloatingPointError, OSError) as e:
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            e = workdir.explain(e) or e
        if flags.FLAGS[verbose_flag].value or isinstance(e, OSError) and \
                not isinstance(e, FileNotFoundError):
            raise
        _exit(one_line(e), 2)
    except KeyboardInterrupt as e:
        _exit(one_line(e) or "interrupted", 128 + getattr(e, "signum", signal.SIGINT))


def _exit(text: str, code: int) -> None:
    print(f"error: {PROCESS}{text}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a failed restore can leave I/O threads (and an interrupted
    # input pipeline its threads) whose shutdown noise would bury the one line that matters.
    os._exit(code)
