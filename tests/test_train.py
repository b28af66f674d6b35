"""train.py as a user meets it: the loss falls and metrics.jsonl holds the docs/design.md fields;
bad flags are one-line errors that write nothing."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from switchzoo.configs import mini
from switchzoo import loop

from conftest import FAST_COMPILE

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_loss_falls_and_metrics_are_written(tmp_path):
    config = mini.get_config("model=switch_tiny,steps=15")   # an LM on the embedded English
    # A 5-step warm-up, not mini's 100: the loss falls by > 1.5 nats in 15 steps (from 60)
    config.log_every_steps, config.eval_every_steps, config.warmup_steps = 5, 15, 5
    config.per_device_batch_size, config.max_length, config.data.vocab_size = 2, 64, 500
    config.layout, config.mesh = "dp_ep", "data:2,model:1,expert:4"
    config.data.embedded_max_pairs, config.data.max_eval_examples = 3000, 64
    config.data.locale_dir = "/nonexistent-catalogues"     # the shipped corpus alone: quicker
    loop.train(config, tmp_path, print_fn=lambda *_: None)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train_rows] == [5, 10, 15]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] - 0.5, train_rows
    for field in ("loss", "aux_loss", "z_loss", "dropped_fraction", "expert_load",
                  "learning_rate", "tokens_per_sec"):
        assert field in train_rows[-1]
    assert len(train_rows[-1]["expert_load"]) == 2 and len(train_rows[-1]["expert_load"][0]) == 8
    evals = [r for r in rows if r["split"] == "eval"]
    assert evals and evals[0]["word_perplexity"] > evals[0]["token_perplexity"] > 1


# What only the command line can get wrong (flag parsing, the config file, command flags), and
# one setting the run refuses, end to end. The run's own refusals of settings are checked
# in-process, case by case, in tests/test_bad_input.py.
@pytest.mark.parametrize("flag, message", [
    ("--config.layoutt=dp_ep", 'Did you mean "layout" instead of "layoutt"'),
    ("--config.num_train_steps=many", "config field num_train_steps='many' is not a valid int"),
    ("--config.mesh=data:3", "has 3 devices but 1 are available"),
    ("--config=configs/nope.py", "No such file or directory: 'configs/nope.py'"),
    ("--devices=32", "--devices is read only with --dry_run"),
])
def test_train_py_rejects_bad_flags_in_one_line(tmp_path, flag, message):
    out = subprocess.run([sys.executable, "train.py", "--config=configs/demo.py", flag,
                          f"--workdir={tmp_path}"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, env={**os.environ, "XLA_FLAGS": FAST_COMPILE})
    assert out.returncode == 2
    assert message in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    assert not any(tmp_path.iterdir()), "a failed start must not write into the workdir"


@pytest.mark.parametrize("argv, line", [
    # get_config's own error, which ml_collections wraps in its whole traceback
    (["--config=configs/demo.py:steps=abc"],
     "config field num_train_steps='abc' is not a valid int"),
    (["--config=configs/demo.py:stpes=7"], "config variant 'stpes=7' is not key=value with a "
                                           "known key; keys: pair, steps or any config field"),
    # an override absl could not convert: in set_field's words
    (["--config=configs/demo.py", "--config.dropout=x"], "config field dropout='x' is not a "
                                                         "valid float"),
    (["--config=configs/demo.py", "--config.scan_layers=maybe"],
     "config field scan_layers='maybe' is not true/false/1/0"),
])
def test_a_bad_config_flag_is_its_cause_alone(monkeypatch, argv, line):
    from absl import flags
    from ml_collections import config_flags

    from switchzoo.commands import cli
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=values)
    argv = ["train.py", *(a.replace("configs/", f"{ROOT}/configs/") for a in argv)]
    monkeypatch.setattr(sys, "argv", argv)         # where ml_collections finds the overrides
    with pytest.raises(Exception) as info:
        values(argv)
        values.config.to_dict()
    assert cli.flag_error(info.value) == line


def test_distributed_flags_where_one_process_runs_are_refused():
    out = subprocess.run([sys.executable, "train.py", "--config=configs/demo.py", "--dry_run",
                          "--num_processes=2", "--coordinator_timeout=5"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "XLA_FLAGS": FAST_COMPILE})
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "--num_processes, --coordinator_timeout: --dry_run compiles" in out.stderr


@pytest.mark.parametrize("name", ["demo", "wmt", "lm1b", "mini", "c4", "c4_cpu"])
def test_every_run_config_loads_opens_with_its_command_and_refuses_unknown_variants(name):
    import importlib
    module = importlib.import_module(f"switchzoo.configs.{name}")
    assert module.__doc__.lstrip().startswith("python train.py --config=configs/" + name)
    config = module.get_config("steps=7")
    assert config.num_train_steps == 7 and config.model
    assert config.task in ("translation", "lm", "span_corruption")
    with pytest.raises(ValueError, match="not key=value with a known key"):
        module.get_config("stpes=7")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_equals_the_smoothed_one_hot_formula(smoothing):
    import jax
    import jax.numpy as jnp

    from switchzoo.config import ModelConfig
    from switchzoo.steps import lm_objective
    cfg = ModelConfig(vocab_size=50, d_model=8, num_heads=1, d_kv=8, d_ff=8, num_layers=1)
    logits = jax.random.normal(jax.random.key(0), (2, 3, 50)) * 3
    targets = jax.random.randint(jax.random.key(1), (2, 3), 0, 50)
    weights = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    target = jax.nn.one_hot(targets, 50) * (1 - smoothing) + smoothing / 50
    want = jnp.sum(-jnp.sum(target * jax.nn.log_softmax(logits), -1) * weights) / 5
    got = lm_objective(logits, {"targets": targets, "weights": weights}, {}, cfg, smoothing)[0]
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)


def test_tokens_per_second_covers_only_the_steps_it_reports():
    from switchzoo import metrics
    now = [0.0]
    meter = metrics.Throughput(clock=lambda: now[0])
    meter.add(100.0)
    now[0] = 30.0                       # the first step, compile included
    meter.restart()
    assert meter.rate() is None         # a row that covers no timed step says so
    meter.add(100.0)
    meter.add(120.0)
    now[0] = 32.0
    assert meter.rate() == 110.0        # 220 tokens in 2 s, whatever the logging interval
    now[0] = 40.0                       # an evaluation ...
    meter.restart()                     # ... is not training time
    meter.add(60.0)
    now[0] = 41.0
    assert meter.rate() == 60.0


def test_dry_run_compiles_the_configs_real_step_for_its_mesh():
    """train.py --dry_run: the run config's step (span corruption's short targets, packing
    fields) compiled for its mesh from abstract state; nothing written."""
    from switchzoo import dry_run
    from switchzoo.configs import c4, c4_cpu
    config = c4_cpu.get_config("model=switch_base_tiny,cf=1.0")
    config.layout, config.mesh = "dp_ep", "data:2,model:1,expert:4"
    config.per_device_batch_size, config.max_length = 1, 32
    assert dry_run.devices_needed(config, None) == 8
    lines = []
    report = dry_run.run(config, print_fn=lines.append)
    assert report["devices"] == 8 and report["batch"] == {"inputs": [8, 32], "targets": [8, 8]}
    assert report["collectives"]["all-to-all"] > 0 and report["memory"]["peak_estimate_bytes"] > 0
    assert lines[0].startswith("dry run: switch_base_tiny") and "compiled in" in lines[1]
    from switchzoo import machine           # compile times are the machine's: it is named
    assert report["machine"] == machine.describe() and lines[2].startswith(
        f"machine: {machine.line()}")
    config.distill.teacher = "teacher_run"
    with pytest.raises(ValueError, match="without a distillation teacher's forward pass"):
        dry_run.run(config)
    paper = c4.get_config()
    assert dry_run.devices_needed(paper, None) == 32                      # the paper's cores
    assert dry_run.batch_shapes(paper, 256)["targets"].shape == (256, 114)
    paper.mesh = "data:-1,expert:8"
    with pytest.raises(ValueError, match=r"leaves an axis open \(-1\): give --devices N"):
        dry_run.devices_needed(paper, None)
    with pytest.raises(ValueError, match="--devices 0: give a positive number"):
        dry_run.devices_needed(paper, 0)
    with pytest.raises(ValueError, match="--devices 16 but mesh 'data:4,model:1,expert:8' has 32"):
        dry_run.devices_needed(c4.get_config(), 16)
