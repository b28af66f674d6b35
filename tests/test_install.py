"""A built wheel carries the catalogue: installed into a fresh environment (no source tree on
its path), it lists the zoo, the layouts and the tables and trains a step from another
directory, from Python and with its switchzoo-train command, on the corpus the wheel ships alone
(the harvester points at an empty directory: a machine with no gettext catalogues). The fresh
environment borrows this one's dependencies (JAX, Flax, ...) by path, not switchzoo: the .pth
that makes this checkout importable is never read there."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import textwrap

from conftest import FAST_COMPILE

ROOT = pathlib.Path(__file__).resolve().parent.parent

PROGRAM = textwrap.dedent("""
    import json, pathlib, sys
    import switchzoo
    from switchzoo import layout, loop, tables, zoo
    from switchzoo.planner import hardware
    from switchzoo.configs import mini
    config = mini.get_config("model=switch_tiny,steps=1")
    config.log_every_steps, config.checkpoint_every_steps, config.eval_every_steps = 1, 1, 0
    config.per_device_batch_size, config.max_length = 2, 32
    config.data.vocab_size, config.data.embedded_max_pairs = 300, 2000
    config.data.locale_dir = sys.argv[2]
    said = []
    row = loop.train(config, sys.argv[1], print_fn=said.append)
    print(json.dumps({"said": said, "file": switchzoo.__file__, "zoo": zoo.names(),
                      "layouts": sorted(layout.presets()), "tables": tables.names(),
                      "hardware": sorted(hardware.profiles()),
                      "loss": row["loss"], "step": row["step"]}))
""")


def test_a_wheel_installed_elsewhere_has_the_catalogue_and_trains(tmp_path):
    # Built from a copy of what the package is made of, so the checkout gains no build/.
    source = tmp_path / "source"
    for part in ("switchzoo", "models", "layouts", "configs"):
        shutil.copytree(ROOT / part, source / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(dist), str(source)],
                           check=True, capture_output=True, text=True)
    # Quiet: setuptools warns (~40 lines) of a shipped folder pyproject.toml does not list.
    assert "Warning" not in built.stdout + built.stderr, (built.stdout + built.stderr)[-3000:]
    (wheel,) = dist.glob("switchzoo-*.whl")
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    # The dependencies, by path: a plain directory entry, whose .pth files Python ignores.
    ours = pathlib.Path(sysconfig.get_paths()["purelib"])
    fresh = pathlib.Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    (fresh / "deps.pth").write_text(f"{ours}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    no_catalogues = tmp_path / "locale"
    no_catalogues.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    out = subprocess.run([str(python), "-c", PROGRAM, str(tmp_path / "run"),
                          str(no_catalogues)], cwd=elsewhere,
                         env={**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert pathlib.Path(got["file"]).is_relative_to(env_dir), got["file"]
    assert {"switch_tiny", "switch_base_8", "switch_c_2048", "t5_base"} <= set(got["zoo"])
    assert {"data_parallel", "dp_ep", "dp_mp_ep", "expert_parallel"} <= set(got["layouts"])
    assert got["hardware"] == ["a100", "h100", "tpu_v3", "tpu_v4", "tpu_v5e"]
    assert "switch_table1" in got["tables"] and "mtf_table2_lm1b_mini" in got["tables"]
    assert got["step"] == 1 and got["loss"] > 0
    assert any("53,474 shipped pairs + 0 from the catalogues" in line for line in got["said"])
    assert (tmp_path / "run" / "checkpoints" / "1").is_dir()
    # The installed command line, with the README's config path, which exists only in the
    # package here: resumes the run above for one more step.
    cmd = [str(env_dir / "bin" / "switchzoo-train"),
           "--config=configs/mini.py:model=switch_tiny,steps=2", "--config.log_every_steps=1",
           "--config.checkpoint_every_steps=1", "--config.eval_every_steps=0",
           "--config.per_device_batch_size=2", "--config.max_length=32",
           "--config.data.vocab_size=300", "--config.data.embedded_max_pairs=2000",
           f"--config.data.locale_dir={no_catalogues}", f"--workdir={tmp_path / 'run'}"]
    out = subprocess.run(cmd, cwd=elsewhere, capture_output=True, text=True,
                         env={**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming at step 1" in out.stdout
    assert (tmp_path / "run" / "checkpoints" / "2").is_dir()
    # The layout search from the wheel, its config and hardware profile read from the package
    # (at its default scanned layers and remat: of the step compiles it could make, the
    # quickest).
    out = subprocess.run([str(python), "-m", "switchzoo.layout", "search", "--model",
                          "switch_tiny", "--devices", "2", "--hardware", "h100", "--config",
                          "configs/lm1b.py", "--length", "16", "--batch", "2", "--top", "1"],
                         cwd=elsewhere, capture_output=True,
                         text=True, env={**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE,
                                         "SWITCHZOO_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "winner: --config.mesh=" in out.stdout


def _recipes() -> dict[str, tuple[list[str], str]]:
    """Makefile target -> (prerequisites, recipe text), with $(VENV) spelt .venv."""
    text = (ROOT / "Makefile").read_text().replace("$(VENV)", ".venv")
    rules, target = {}, None
    for line in text.splitlines():
        if line.startswith("\t") and target:
            rules[target][1].append(line.strip())
        elif ":" in line and not line.startswith((" ", "#")) and "=" not in line.split(":")[0]:
            target, _, rest = line.partition(":")
            rules[target.strip()] = (rest.split("##")[0].split(), [])
        else:
            target = None
    return {t: (pre, "\n".join(r)) for t, (pre, r) in rules.items()}


def test_make_demo_installs_only_what_the_main_job_needs():
    rules = _recipes()

    def installs(target):       # every recipe a target's set-up runs, prerequisites first
        pre, recipe = rules[target]
        return "".join(installs(p) for p in pre if p in rules) + recipe
    demo, test = installs("demo"), installs("test")
    assert "pip install -q -e ." in demo
    assert "[test]" not in demo and "torch" not in demo.replace("$(TORCH)", "torch")
    assert "$(TORCH)" in test and '-e ".[test]"' in test
