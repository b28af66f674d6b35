"""Wrong inputs across the surface, each refused with one line that names the problem and the
fix, and an existing run's checkpoints left untouched. (The flag-level cases, run through
train.py itself for the exit status and the absence of tracebacks, are in test_train.py.)"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import switchzoo
from conftest import FAST_COMPILE
from switchzoo.configs import mini
from switchzoo import checkpoints, evaluate, hf, loop, tables, tensorfile, weights
from switchzoo import state as state_lib
from switchzoo.data import embedded

ERRORS = (ValueError, FileNotFoundError)
ROOT = pathlib.Path(__file__).resolve().parent.parent
# A directory with no gettext catalogues (a machine without them), the same for every config
# here, so that each case's config agrees with the finished run's but for its own fields.
NO_CATALOGUES = "/nonexistent-catalogues"


def lm_config(**fields):
    c = mini.get_config("model=switch_tiny,steps=3")
    c.per_device_batch_size, c.max_length, c.eval_every_steps = 1, 32, 0
    c.checkpoint_every_steps = 3
    c.data.vocab_size, c.data.embedded_max_pairs = 300, 2000
    for key, value in fields.items():
        node = c
        *parents, leaf = key.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    if c.data.source != "embedded":      # a field only the embedded source reads
        c.data.embedded_max_pairs = 0
    elif "data__locale_dir" not in fields:
        c.data.locale_dir = NO_CATALOGUES    # the shipped corpus alone: quicker
    return c


def translation_config(**fields):
    c = lm_config(**fields)
    c.model, c.task = fields.get("model", "switch_base_tiny"), "translation"
    c.data.pair = fields.get("data__pair", "en-de")
    return c


def snapshot(root: pathlib.Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run whose checkpoints every case below must leave alone."""
    workdir = tmp_path_factory.mktemp("run")
    loop.train(lm_config(), workdir, print_fn=lambda *_: None)
    return workdir


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    pairs = embedded.shipped("de")[:200]
    (root / "good.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    (root / "notab.tsv").write_text("Open file\tDatei öffnen\nClose file Datei schließen\n")
    (root / "empty.tsv").write_text("")
    (root / "latin1.tsv").write_bytes("Größe\tsize\n".encode("latin-1"))
    return root


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    switchzoo.init(switchzoo.zoo.get("switch_base_tiny").replace(vocab_size=512)).save_pretrained(
        root / "good", expert_capacity=64)       # a catalogue model: fixed slots to export
    return root


def edited(hf_dir, name, change):
    out = hf_dir / name
    if not out.exists():
        shutil.copytree(hf_dir / "good", out)
        f = tensorfile.TensorFile(hf_dir / "good" / hf.SINGLE)
        tensorfile.write_arrays(out / hf.SINGLE, change({n: np.array(f.get(n)) for n in f.names()}))
    return out


RUN_CASES = [   # (config fields, message): against the finished run's workdir
    (dict(model="switch_tinny"), r"unknown model 'switch_tinny' \(did you mean 'switch_tiny'\?\)"),
    (dict(model="switch_base_tiny", task="translation"), r"holds a run of model 'switch_tiny'"),
    (dict(layout="data_paralel"), r"unknown layout preset .*did you mean 'data_parallel'"),
    (dict(mesh="data2"), r"entry 'data2' is not 'axis:size'"),
    (dict(mesh="data:3"),
     r"has 3 devices but 8 are available; .*; on this machine, `train\.py \.\.\. --dry_run`"),
    (dict(mesh="data:-1,model:-1"), r"more than one axis is -1"),
    (dict(layout="batch:data,heads"), r"entry 'heads' is not 'dim:axis'"),
    (dict(layout="bach:data"), r"unknown dimension 'bach' \(did you mean 'batch'\?\)"),
    (dict(layout="batch:dta", mesh="data:8"), r"mesh axis 'dta' \(did you mean 'data'\?\)"),
    (dict(layout="heads:model", mesh="data:1,model:8"),
     r"'heads' of size 4 is not divisible by mesh axes model \(8 devices\)"),
    (dict(layout="d_model:model,d_ff:model", mesh="data:1,model:8"),
     r"mesh axis 'model' is used by both 'd_model' and 'd_ff'"),
    (dict(optimizer="sgd"), r"--config.optimizer='sgd' is not one of adamw, adafactor"),
    (dict(grad_accum_steps=3), r"grad_accum_steps=3 must be >= 1 and divide the global batch "
                               r"of 8 rows"),
    # counts and rates: the field, the value and the allowed range
    (dict(num_train_steps=-5), r"--config.num_train_steps=-5 is out of range: it must be >= 1$"),
    (dict(grad_accum_steps=0), r"--config.grad_accum_steps=0 is out of range: it must be >= 1"),
    (dict(log_every_steps=0), r"log_every_steps=0 is out of range: it must be >= 1"),
    (dict(eval_every_steps=-1), r"eval_every_steps=-1 .* >= 0 \(0: never\)"),
    (dict(checkpoint_every_steps=0), r"checkpoint_every_steps=0 .* >= 1"),
    (dict(keep_checkpoints=0), r"keep_checkpoints=0 .* >= 1"),
    (dict(max_length=1), r"max_length=1 .* >= 2 \(one token \+ EOS\)"),
    (dict(warmup_steps=-10), r"warmup_steps=-10 .* >= 0"),
    (dict(learning_rate=0.0), r"learning_rate=0.0 .* > 0"),
    (dict(dropout=1.0), r"dropout=1.0 .* >= 0 and < 1"),
    (dict(label_smoothing=-0.1), r"label_smoothing=-0.1 .* >= 0 and < 1"),
    (dict(seed=-1), r"seed=-1 .* >= 0"),
    (dict(dtype="float16"), r"dtype='float16' is not one of float32, bfloat16"),
    (dict(data__vocab_size=10), r"data.vocab_size=10 .* >= 32"),
    (dict(data__embedded_max_pairs=-1), r"embedded_max_pairs=-1 .* >= 0 \(0: all\)"),
    (dict(moe__top_k=0), r"--config.moe.top_k=0 .* >= 1"),
    (dict(moe__train_capacity_factor=0.0), r"moe.train_capacity_factor=0.0 .* > 0"),
    (dict(moe__jitter=1.5), r"moe.jitter=1.5 .* >= 0 and < 1"),
    (dict(moe__expert_dropout=-0.2), r"moe.expert_dropout=-0.2 .* >= 0 and < 1"),
    (dict(moe__aux_loss_weight=-0.01), r"moe.aux_loss_weight=-0.01 .* >= 0"),
    (dict(moe__dispatch="sorted"), r"moe.dispatch='sorted' is not one of auto, einsum, dropless"),
    (dict(moe__router="bad"), r"moe.router='bad' is not one of tokens_choose, experts_choose"),
    (dict(moe__bias_rate=0.01), r"moe.bias_rate=0.01 is read only with moe.balance=bias, and "
     r"this run has moe.balance=the model's own"),
    (dict(moe__balance="bias", moe__aux_loss_weight=0.1), r"aux_loss_weight=0.1 is read only "
     r"with moe.balance=aux_loss"),
    (dict(moe__router="experts_choose"), r"^moe.router='experts_choose' in a decoder-only model: "
     r".*not causal.*--config.moe.noncausal_decoder=true"),
    # a setting the run would not read
    (dict(data__train_files="mine.tsv"), r"--config.data.train_files='mine.tsv' is read only "
     r"with data.source=files, and this run has data.source=embedded"),
    (dict(data__tfds_name="lm1b"), r"data.tfds_name='lm1b' is read only with data.source=tfds"),
    (dict(data__source="files", data__train_files="x.txt", data__locale_dir="/tmp",
          data__pair="en-de"),
     r"data.locale_dir='/tmp' is read only with data.source=embedded, and this run has "
     r"data.source=files"),
    (dict(optimizer="adafactor", weight_decay=0.1),
     r"weight_decay=0.1 is read only with optimizer=adamw, and this run has optimizer=adafactor"),
    (dict(eval__num_beams=8), r"eval.num_beams=8 is read only with task=translation"),
]


@pytest.mark.parametrize("fields, message", RUN_CASES)
def test_run_level_mistakes(run, fields, message):
    before = snapshot(run)
    with pytest.raises(ERRORS, match=message) as info:
        loop.train(lm_config(**fields), run, print_fn=lambda *_: None)
    assert "\n" not in str(info.value)
    assert snapshot(run) == before


FRESH_CASES = [  # (config, message): a new workdir
    (lambda f, h: lm_config(task="classify"), r"task='classify' is not one of translation, lm"),
    (lambda f, h: lm_config(model="switch_base_tiny"), r"task 'lm' needs a decoder-only model"),
    (lambda f, h: lm_config(model="dense_tiny", moe__top_k=2), r"dense model 'dense_tiny'"),
    (lambda f, h: lm_config(data__source="nowhere"), r"source='nowhere' is not one of embedded"),
    (lambda f, h: lm_config(data__pair="en-xx"), r"ships en-de and .* no 'xx' gettext"),
    (lambda f, h: lm_config(per_device_batch_size=0), r"per_device_batch_size=0 .* >= 1"),
    (lambda f, h: lm_config(data__vocab_size=100000), r"vocab_size"),
    (lambda f, h: translation_config(data__source="files", data__train_files=str(f / "nope.tsv")),
     r"nope\.tsv"),
    (lambda f, h: translation_config(data__source="files", data__train_files=str(f / "notab.tsv")),
     r"notab\.tsv:2"),
    (lambda f, h: translation_config(data__source="files", data__train_files=str(f / "empty.tsv")),
     r"empty"),
    (lambda f, h: translation_config(data__source="files",
                                     data__train_files=str(f / "latin1.tsv")), r"UTF-8"),
    (lambda f, h: translation_config(init_from=str(f)), r"has no config\.json"),
    (lambda f, h: translation_config(init_from=str(edited(
        h, "missing", lambda t: {k: v for k, v in t.items() if "expert_3.wi" not in k}))),
     r"missing tensors: .*expert_3\.wi"),
    (lambda f, h: translation_config(init_from=str(edited(
        h, "extra", lambda t: {**t, "encoder.block.0.layer.7.mlp.wi.weight": t["shared.weight"]}))),
     r"unexpected tensors .*refusing to drop them"),
    (lambda f, h: translation_config(init_from=str(edited(
        h, "shape", lambda t: {**t, "shared.weight": t["shared.weight"][:, :-1]}))),
     r"mis-shaped tensors: shared\.weight"),
]


@pytest.mark.parametrize("case, message", FRESH_CASES)
def test_configuration_data_and_checkpoint_mistakes(files, hf_dir, tmp_path, case, message):
    with pytest.raises(ERRORS, match=message) as info:
        loop.train(case(files, hf_dir), tmp_path / "new", print_fn=lambda *_: None)
    assert "\n" not in str(info.value)
    # nothing left behind: not the corpus cache and vocabulary of the too-large vocab_size,
    # not the data and tokenizer written before a checkpoint's tensors were found wanting
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("case, message", [
    (lambda: lm_config(model="dense_tiny", moe__top_k=2), r"dense model 'dense_tiny'"),
    (lambda: translation_config(moe__router="experts_choose", moe__dispatch="dropless"),
     r"moe.dispatch='dropless' with moe.router='experts_choose'"),
    (lambda: lm_config(layout="batch:data,heads:data", mesh="data:8"),
     r"'heads' of size 4 is not divisible by mesh axes data"),
    (lambda: lm_config(data__vocab_path="/nowhere/spm.model"), r"/nowhere/spm.model does not"),
])
def test_refusals_that_need_the_model_come_before_the_data(monkeypatch, tmp_path, case,
                                                           message):
    """The corpus cache and a SentencePiece vocabulary take seconds to write: a setting the
    model refuses is refused first, and no workdir is made."""
    def build(*args, **kwargs):
        raise AssertionError("the data was built before the model's refusal")
    monkeypatch.setattr(loop.data, "build", build)
    with pytest.raises(ERRORS, match=message):
        loop.train(case(), tmp_path / "runs" / "new", print_fn=lambda *_: None)
    assert not (tmp_path / "runs").exists()


def test_a_failed_start_leaves_the_workdir_as_it_found_it(tmp_path):
    # tfds data that was never prepared: no workdir, nor the directories above it
    config = lm_config(data__source="tfds", data__tfds_data_dir=str(tmp_path / "tfds"))
    with pytest.raises(ERRORS, match=r"not prepared in .*tfds build lm1b "
                                     r"--file_format=array_record --data_dir=DIR"):
        loop.train(config, tmp_path / "runs" / "lm", print_fn=lambda *_: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # a directory the user made keeps what it held, and gets nothing of a start that wrote
    # the corpus cache and then failed (a vocabulary too large for the text)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ERRORS, match=r"vocab_size to at most"):
        loop.train(lm_config(data__vocab_size=100000), mine, print_fn=lambda *_: None)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_run_past_its_steps_says_so_and_changes_nothing(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before = snapshot(copy)
    lines = []
    assert loop.train(lm_config(num_train_steps=2), copy, print_fn=lines.append) == {}
    assert len(lines) == 1 and "is already at step 3, past num_train_steps=2: nothing to " \
        "train" in lines[0], lines
    assert snapshot(copy) == before


def test_checkpoints_without_their_config_json_are_not_resumed_blind(run, tmp_path):
    """A workdir whose config.json was lost (deleted, or the directory recreated by a process
    still running) keeps checkpoints no setting can be checked against: refused in one line,
    untouched, unless allow_changes takes this command's settings for them."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "config.json").unlink()
    before = snapshot(copy)
    with pytest.raises(ERRORS, match=r"has checkpoints \(steps .*3\) but no config.json, so "
                                     r"what trained them cannot be checked"):
        loop.train(lm_config(num_train_steps=4), copy, print_fn=lambda *_: None)
    assert snapshot(copy) == before
    lines = []
    loop.train(lm_config(num_train_steps=4, allow_changes=True), copy, print_fn=lines.append)
    assert any("resuming at step 3" in line for line in lines)
    assert (copy / "config.json").is_file()


def test_init_from_says_what_it_loaded(run, tmp_path):
    lines = []
    loop.train(lm_config(init_from=str(run), num_train_steps=1, checkpoint_every_steps=1),
               tmp_path / "new", print_fn=lines.append)
    said = [x for x in lines if x.startswith("init_from:")]
    origin = weights.resolve(run)
    setup = state_lib.setup(origin.cfg, "data_parallel")
    ckpt = checkpoints.Checkpoints(run / "checkpoints", 1, None)
    params = jax.tree.leaves(ckpt.restore_params(3, setup.abstract, setup.shardings))
    ckpt.close()
    assert said == [f"init_from: loaded {len(params)} tensors "
                    f"({sum(x.size for x in params):,} parameters) from run {run} "
                    "(checkpoint 3); a fresh optimizer from step 0"], lines


def test_pickle_only_checkpoints_are_refused(hf_dir, tmp_path):
    (tmp_path / "pt").mkdir()
    shutil.copy(hf_dir / "good" / "config.json", tmp_path / "pt")
    (tmp_path / "pt" / "pytorch_model.bin").write_bytes(b"\x80\x04never unpickled")
    with pytest.raises(ERRORS, match=r"pickle files are never loaded"):
        loop.train(translation_config(init_from=str(tmp_path / "pt")), tmp_path / "new")


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_checkpoint_is_refused_and_left_as_it_is(run, tmp_path, damage):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for f in (copy / "checkpoints").rglob("*"):
        if f.is_file() and f.parent.name == "d":              # the array data files
            data = f.read_bytes()
            f.write_bytes(data[:len(data) // 2] if damage == "truncate" else b"\0" * len(data))
    before = snapshot(copy)
    with pytest.raises(ERRORS, match=r"checkpoint 3 in .* is damaged \(.*\) and there is no "
                                     r"older step; nothing was changed"):
        loop.train(lm_config(num_train_steps=6), copy, print_fn=lambda *_: None)
    assert snapshot(copy) == before


def test_eval_mistakes(run, tmp_path):
    with pytest.raises(ERRORS, match=r"has no config\.json \(not a training run\)"):
        evaluate.load_config(tmp_path)
    with pytest.raises(ERRORS, match=r"unknown table 'switch_tabel1' \(did you mean "
                                     r"'switch_table1'\?\)"):
        tables.collect("switch_tabel1", [str(run)])
    empty = tmp_path / "run_without_checkpoints"
    empty.mkdir()
    (empty / "config.json").write_text((run / "config.json").read_text())
    with pytest.raises(ERRORS, match=r"holds no complete checkpoint"):
        evaluate.run(lm_config(), empty, print_fn=lambda *_: None)


def test_variants_take_commas_inside_values_and_only_real_bools():
    from switchzoo.configs import demo
    c = demo.get_config("mesh=data:2,model:2,steps=10,layout=batch:data,heads:model,"
                        "shard_optimizer_over_data=yes")
    assert (c.mesh, c.num_train_steps, c.layout) == ("data:2,model:2", 10, "batch:data,heads:model")
    assert c.shard_optimizer_over_data is True
    assert demo.get_config("shard_optimizer_over_data=0").shard_optimizer_over_data is False
    for bad, message in [("shard_optimizer_over_data=ture", r"'ture' is not true/false/1/0/yes/no"),
                         ("steps=ten", r"num_train_steps='ten' is not a valid int"),
                         ("model:2", r"'model:2' is not key=value with a known key")]:
        with pytest.raises(ValueError, match=message):
            demo.get_config(bad)


def test_eval_overrides_of_a_saved_config(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before = snapshot(copy)
    for overrides, message in [
            ({"num_train_steps": "9"}, r"--config.num_train_steps cannot change when evaluating"),
            ({"data.max_eval_examples": "many"}, r"max_eval_examples='many' is not a valid int"),
            ({"eval.max_examples": "-1"}, r"eval.max_examples=-1 is out of range")]:
        with pytest.raises(ERRORS, match=message):
            evaluate.run(evaluate.load_config(copy, overrides), copy, print_fn=lambda *_: None)
    assert snapshot(copy) == before
    # The command line, as a user types it: overrides without --config=FILE.
    out = subprocess.run([sys.executable, "eval.py", f"--workdir={copy}",
                          "--config.data.max_eval_examples=3", "--config.per_device_batch_size=1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "XLA_FLAGS": FAST_COMPILE})
    assert out.returncode == 0, out.stderr[-2000:]
    # a subset of the held-out set has a results file of its own (switchzoo.record)
    [subset] = copy.glob("results-first3-*.json")
    assert not (copy / "results.json").exists() and f"results: {subset} " in out.stdout
    results = json.loads(subset.read_text())
    assert results["step"] == 3 and results["split"] == "held out"
    from switchzoo import machine           # the figures name the machine they came from
    assert results["machine"] == machine.describe() and "machine: " in out.stdout
    out = subprocess.run([sys.executable, "eval.py", f"--workdir={copy}", "--config.seed=1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "XLA_FLAGS": FAST_COMPILE})
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "--config.seed cannot change when evaluating a trained run" in out.stderr


def test_a_run_saved_before_the_unread_field_checks_still_evaluates(run, tmp_path):
    copy = tmp_path / "old"
    shutil.copytree(run, copy)
    saved = json.loads((copy / "config.json").read_text())
    saved["data"]["eval_split"] = "validation"      # what older runs wrote under every source
    (copy / "config.json").write_text(json.dumps(saved))
    config = evaluate.load_config(copy, {"data.max_eval_examples": "2"})
    assert config.data.eval_split == "" and config.data.max_eval_examples == 2
    with pytest.raises(ERRORS, match=r"data.tfds_data_dir='/x' is read only with data.source="):
        evaluate.run(evaluate.load_config(copy, {"data.tfds_data_dir": "/x"}), copy)
