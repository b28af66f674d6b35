"""Every command README.md and docs/*.md show in a shell block is checked as its command line
would check it, without running it: train.py and eval.py through their absl flags, the config
file and its overrides, and --check (settings, model, layout and mesh shape, the eval overrides,
a table's name); the argparse tools (python -m switchzoo..., experiments/, bench/) through their
parsers; `make` targets in the Makefile; `pip install ".[extra]"` extras in pyproject.toml; and
`python -c` code compiled. So a renamed flag, field, preset, model or target fails here. Usage
lines with placeholders (``[--json]``, ``...``) are left out, and counted."""
import json
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYTHONS = {"python", "python3", ".venv/bin/python"}


def shell_lines(text: str) -> list[str]:
    """The lines of the page's shell blocks (```bash, ```sh or unlabelled), continuations
    joined, comments and prompts dropped."""
    lines, inside, lang, pending = [], False, "", ""
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            inside, lang = not inside, fence.group(1)
            continue
        if not inside or lang not in ("bash", "sh", "shell", ""):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((pending + line).strip())
        pending = ""
    return [x for x in lines if x and not x.startswith("#")]


def segments(line: str) -> list[list[str]]:
    """The commands of a line (split at &&, | and ;), each without its environment
    assignments, `nice -n N` or trailing comment."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    out, current = [], []
    for w in words + ["&&"]:
        if w in ("&&", "|", ";", "||"):
            while current and re.match(r"^[A-Z_]+=", current[0]):
                current = current[1:]
            if current[:1] == ["nice"]:
                current = current[3:]
            if current:
                out.append(current)
            current = []
        else:
            current.append(w)
    return out


def documented() -> tuple[dict[str, list], list[str]]:
    """{kind: [(page, argv)]} of every checkable command, and the placeholder lines left out."""
    found = {"train": [], "eval": [], "argparse": [], "make": [], "extra": [], "code": []}
    skipped = []
    for page in PAGES:
        for line in shell_lines(page.read_text()):
            for words in segments(line):
                head, rest = words[0], words[1:]
                if head in PYTHONS and rest:
                    if any(w in ("...", "…") or w.startswith("[") or "…" in w for w in rest):
                        skipped.append(f"{page.name}: {line}")
                    elif rest[0] in ("train.py", "eval.py"):
                        found[rest[0][:-3]].append((page.name, rest[1:]))
                    elif rest[0] == "-m" and rest[1].startswith("switchzoo"):
                        found["argparse"].append((page.name, rest[1:]))
                    elif rest[0] == "-c":
                        found["code"].append((page.name, rest[1:2]))
                    elif rest[0].endswith(".py"):
                        found["argparse"].append((page.name, rest))
                elif head == "make" and rest:
                    found["make"].append((page.name, rest[:1]))
                elif head.endswith("pip") or words[:3] == ["python", "-m", "pip"]:
                    found["extra"] += [(page.name, [m]) for w in words
                                       for m in re.findall(r"\.\[([\w,-]+)\]", w)]
    return found, skipped


def run(kind: str, commands: list) -> list[dict]:
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "doc_command_runner.py"), kind,
                          json.dumps([argv for _, argv in commands])], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_the_pages_show_commands_to_check():
    found, skipped = documented()
    assert len(found["train"]) >= 20 and len(found["eval"]) >= 8, found
    assert len(found["argparse"]) >= 25 and found["make"] and found["extra"]
    assert len(skipped) <= 8, skipped          # usage lines with placeholders stay few


def check(kind: str, wrong: list[str], says: str):
    """Every documented command of ``kind`` holds; ``wrong``, run last in the same process,
    is refused with ``says`` (so the check can fail, after the documented ones)."""
    found, _ = documented()
    results = run(kind, found[kind] + [("a wrong command", wrong)])
    bad = [f"{page}: {' '.join(argv)} -> {r['said']}"
           for (page, argv), r in zip(found[kind], results) if r["code"] != 0]
    assert not bad, "documented commands that do not hold:\n" + "\n".join(bad)
    assert results[-1]["code"] == 2 and says in results[-1]["said"], results[-1]


def test_every_documented_train_command_holds():
    check("train", ["--config=configs/demo.py", "--config.moe.top_k=0", "--workdir=x"],
          "--config.moe.top_k=0 is out of range")


def test_every_documented_eval_command_holds():
    check("eval", ["--workdir=x", "--config.model=switch_tiny"],
          "--config.model cannot change when evaluating a trained run")


def test_every_documented_tool_command_parses():
    check("argparse", ["switchzoo.layout", "search", "--model", "switch_base_128",
                       "--devices", "32", "--hardware", "tpu_v3", "--no-such-flag"],
          "unrecognized arguments: --no-such-flag")


def test_documented_make_targets_extras_and_code_exist():
    found, _ = documented()
    makefile = (ROOT / "Makefile").read_text()
    missing = [t for _, (t,) in found["make"] if not re.search(rf"^{re.escape(t)}:", makefile,
                                                              re.M)]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    missing += [f".[{e}]" for _, (group,) in found["extra"] for e in group.split(",")
                if e not in extras]
    for page, (code,) in found["code"]:
        compile(code, page, "exec")
    assert not missing, missing


def test_the_configuration_reference_is_current():
    """docs/config.md is what switchzoo.config_reference generates from the definitions that
    check the flags (make docs rewrites it): every field, type, default and allowed value."""
    from switchzoo import config_reference
    from switchzoo.configs import base
    text = config_reference.markdown()
    assert (ROOT / "docs" / "config.md").read_text() == text, \
        "docs/config.md is stale: python -m switchzoo.config_reference > docs/config.md"
    for name, _, _ in config_reference.fields(base.get_base()):
        assert f"| `{name}` |" in text, name
    assert "| `moe.top_k` | int | unset | >= 1 |" in text
    assert "| `weight_decay` | float | `0.0` | >= 0 | optimizer=adamw |" in text
