"""The command line the checkpoint-reading experiments share (specialisation.py, routing_churn.py,
expert_swap.py): one or more --workdir of trained runs, the held-out --corpus, a positive count of
held-out examples, --json / --publish; a user's mistake is one line on stderr and exit status 2
with nothing written; the report is {command, commit, machine, ..., runs} as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402
from common import machine  # noqa: E402
from switchzoo import errors  # noqa: E402


class Bad(Exception):      # a user mistake: one line on stderr, exit status 2
    pass


def parser(doc: str, name: str, count: str = "examples") -> argparse.ArgumentParser:
    """--workdir (repeatable), --corpus, --<count> (default 200), --publish and --json (default
    <name>.json beside the first --workdir, docs/<name>.json with --publish)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--workdir", action="append", required=True, type=pathlib.Path)
    p.add_argument("--corpus", type=pathlib.Path, default=ROOT / "runs" / "corpus")
    p.add_argument(f"--{count}", type=int, default=200)
    harness.publish_argument(p)
    p.add_argument("--json", type=pathlib.Path, help=f"default: {name}.json beside the first "
                   f"--workdir (docs/{name}.json with --publish)")
    return p


def run(p: argparse.ArgumentParser, argv, name: str, analyse, summary,
        count: str = "examples", fields=None, check=None) -> int:
    """Parse ``argv``; ``check(args)`` (may raise Bad); ``analyse(workdir, args)`` per --workdir;
    write {command, commit, machine, **fields(args), runs} to --json and print ``summary(runs)``.
    Returns the exit status."""
    args = p.parse_args(argv)
    args.json = harness.unpublished(args.json or (
        harness.DOCS if args.publish else args.workdir[0].parent) / f"{name}.json", args.publish)
    try:
        if getattr(args, count) < 1:
            raise Bad(f"--{count} {getattr(args, count)}: pass a positive count, e.g. 200")
        if check is not None:
            check(args)
        runs = [analyse(w, args) for w in args.workdir]
    except (Bad, FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {errors.one_line(e)}", file=sys.stderr)
        return 2
    command = shlex.join(["python", f"experiments/{name}.py",
                          *(sys.argv[1:] if argv is None else argv)])
    report = {"command": command, "commit": harness.commit(), "machine": machine(),
              **(fields(args) if fields else {}), "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(summary(runs))
    print(f"\nwrote {args.json}")
    return 0


def exit_with(code: int) -> None:
    """Exit with ``code``; after an error without the checkpoint readers' teardown noise below
    the one line (as commands.cli.run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)
