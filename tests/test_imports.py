"""The house has no circles: no two library modules import each other (directly or round a
longer loop, at the top of a file or inside a function), and no library module imports a
command line (switchzoo.commands: absl flags, entry points), read from the source and seen in
a fresh process."""
import ast
import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
ROOT = REPO / "switchzoo"
COMMANDS = "switchzoo.commands"        # the command lines: only entry points import them
COMMAND_LINE = (COMMANDS, "switchzoo.cli")   # switchzoo.cli: where they lived before, a circle


def modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """{dotted name: file} of every module of the package's source tree."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: pathlib.Path, known) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (``from switchzoo import x``
    counts as switchzoo.x where x is a module, else as the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                         for a in node.names)
    out = set()
    for target in found:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


@functools.cache
def graph() -> dict[str, set[str]]:
    """{module: the package modules it imports}, read from the source tree."""
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One loop (``[a, b, ..., a]``) per back edge of a depth-first walk: none iff acyclic."""
    found, state, stack = [], {}, []

    def walk(v):
        state[v] = "open"
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == "open":
                found.append(stack[stack.index(w):] + [w])
            elif w not in state:
                walk(w)
        stack.pop()
        state[v] = "done"

    for v in sorted(edges):
        if v not in state:
            walk(v)
    return found


def library(names) -> list[str]:
    """The library modules: all but the command lines and ``__main__`` files (which run one)."""
    return [n for n in names
            if not n.startswith(COMMAND_LINE) and not n.endswith("__main__")]


def test_cycles_are_found():
    """The walk itself: the circle this test was written against (cli <-> commands <-> loop)."""
    edges = {"cli": {"commands.train"}, "commands.train": {"cli", "loop"}, "loop": {"cli"},
             "dims": set()}
    assert sorted(map(tuple, cycles(edges))) == [("cli", "commands.train", "cli"),
                                                 ("cli", "commands.train", "loop", "cli")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_package():
    assert "switchzoo.state" in graph()["switchzoo.loop"]     # the reading itself works
    found = [" -> ".join(c) for c in cycles(graph())]
    assert not found, "import circles: " + "; ".join(found)


def test_no_library_module_imports_a_command_line():
    bad = {name: sorted(t for t in graph()[name] if t.startswith(COMMAND_LINE))
           for name in library(graph())}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"library modules importing command lines: {bad}"


# Imports each module in turn in one process; after each, what command-line code is loaded:
# switchzoo.commands / switchzoo.cli modules, and absl flags defined by switchzoo modules.
_PROBE = """
import importlib, json, sys
loaded = {}
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
    bad = sorted(m for m in sys.modules if m.startswith(tuple(json.loads(sys.argv[2]))))
    if "absl.flags" in sys.modules:
        from absl import flags
        bad += sorted(f"absl flags of {m}" for m in flags.FLAGS.flags_by_module_dict()
                      if m.startswith("switchzoo"))
    if bad:
        loaded[name] = bad
        break
print(json.dumps(loaded))
"""


def test_importing_the_library_loads_no_command_line():
    names = library(modules())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(names),
                          json.dumps(COMMAND_LINE)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert not loaded, f"importing a library module loaded command-line code: {loaded}"


# train.py / eval.py under a python without the project's packages (absl hidden here): the
# entry point's one-line hint, not a ModuleNotFoundError traceback.
_WITHOUT_ABSL = """
import importlib.abc, runpy, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "absl":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_scripts_without_their_dependencies_say_what_to_do_in_one_line():
    env = {**os.environ, "SWITCHZOO_HUGE_PAGES": "0"}     # no re-run: it would drop the hiding
    for script in ("train.py", "eval.py"):
        out = subprocess.run([sys.executable, "-c", _WITHOUT_ABSL, script, "--workdir=x"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stdout == "", (script, out.stderr[-2000:])
        assert out.stderr.splitlines() == [
            f"error: the Python package 'absl' is not installed for {sys.executable}: use the "
            "project's environment (source .venv/bin/activate, or run .venv/bin/python; make "
            "demo creates it)"], out.stderr[-2000:]


def lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess:
    """import-linter's contracts of ``root``/pyproject.toml, on the package in ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import "
                           "lint_imports_command as c; sys.exit(c())", "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_floors_hold():
    """The layers contract in pyproject.toml ([tool.importlinter]): every module of the
    package is on a floor, and imports (at the top of a file or inside a function) only its
    own floor and those below."""
    out = lint_imports(REPO)
    assert out.returncode == 0 and "1 kept, 0 broken" in out.stdout, out.stdout[-3000:]


def test_an_upward_import_inside_a_function_breaks_the_floors(tmp_path):
    """The contract can fail: the package copied with state.py importing loop (three floors up)
    inside a function, as layout once reached up to state, dry_run and zoo."""
    shutil.copytree(ROOT, tmp_path / "switchzoo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    with open(tmp_path / "switchzoo" / "state.py", "a") as f:
        f.write("\n\ndef _reaches_up():\n    from switchzoo import loop\n    return loop\n")
    out = lint_imports(tmp_path)
    assert out.returncode == 1 and "0 kept, 1 broken" in out.stdout, out.stdout[-3000:]
    assert "switchzoo.state -> switchzoo.loop" in out.stdout


def test_no_file_is_over_400_lines():
    """Small files with one job: the library, the commands, the tests, bench/ and
    experiments/."""
    files = [*ROOT.rglob("*.py"), *(REPO / d for d in ("train.py", "eval.py")),
             *(p for d in ("tests", "bench", "experiments") for p in (REPO / d).rglob("*.py"))]
    long = {str(p.relative_to(REPO)): n for p in files
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
