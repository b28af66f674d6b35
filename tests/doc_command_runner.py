"""Runs documented commands through their real flag and config checks, without running them
(tests/test_documented_commands.py). One process per kind, since train.py's and eval.py's absl
flags cannot be defined in one process:

    python tests/doc_command_runner.py train|eval|argparse COMMANDS_JSON  ->  JSON results

train / eval: each argv is parsed by the command's own absl parser (the --config file, its
variant and every --config.FIELD override) and run with --check (switchzoo.commands: settings,
model, layout and mesh shape, or the table / the eval overrides), which stops before anything
runs. argparse: the module or script runs as ``__main__`` until its parser has parsed the
arguments, then stops. Each result: {"code": exit status (0: it holds), "said": its last line}.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import runpy
import sys


class Parsed(Exception):
    """Raised by the patched parse_args once the arguments have parsed."""


def absl_check(kind: str, argv: list[str]) -> dict:
    from absl import flags
    from switchzoo.commands import cli
    # cli's one-line exit ends the process at once (os._exit: a multi-process run's teardown);
    # here it is the command's result
    cli._exit = lambda text, code: (print(f"error: {text}", file=sys.stderr), sys.exit(code))
    module = __import__(f"switchzoo.commands.{kind}", fromlist=["main"])
    parse = getattr(module, "parse_flags", cli.parse_flags)
    if hasattr(module, "OVERRIDES"):
        module.OVERRIDES.clear()
    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
        delattr(flags.FLAGS, name)         # the last config file's override flags
    sys.argv = [f"{kind}.py", *argv, "--check"]     # config_flags reads overrides from it
    return captured(lambda: module.main(parse(sys.argv)))


def argparse_check(target: str, argv: list[str]) -> dict:
    originals = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside = []

    def parse_args(self, args=None, namespace=None):      # unknown arguments still refused
        inside.append(1)
        originals[0](self, args, namespace)
        raise Parsed

    def parse_known_args(self, args=None, namespace=None):
        result = originals[1](self, args, namespace)
        if not inside:                     # a tool that takes unknown arguments on purpose
            raise Parsed
        return result

    def run():
        sys.argv = [target, *argv]
        argparse.ArgumentParser.parse_args = parse_args
        argparse.ArgumentParser.parse_known_args = parse_known_args
        try:
            if target.endswith(".py"):
                sys.path.insert(0, str(pathlib.Path(target).resolve().parent))
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
        except Parsed:
            print("parsed")
        finally:
            argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = \
                originals
    return captured(run)


def captured(fn) -> dict:
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            fn()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception as e:           # noqa: BLE001  (reported as the command's failure)
            code, err = 1, io.StringIO(f"{type(e).__name__}: {e}")
    said = (err.getvalue().strip() or out.getvalue().strip()).splitlines()
    return {"code": code, "said": said[-1] if said else ""}


def main() -> int:
    kind, commands = sys.argv[1], json.loads(sys.argv[2])
    results = []
    for command in commands:
        if kind in ("train", "eval"):
            results.append(absl_check(kind, command))
        else:
            results.append(argparse_check(command[0], command[1:]))
    sys.stdout = sys.__stdout__
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
