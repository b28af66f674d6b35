"""Wrong inputs across the surface, each refused with one line that names the problem and the
fix, and an existing run's checkpoints left untouched. (The flag-level cases, run through
train.py itself for the exit status and the absence of tracebacks, are in test_train.py.)"""
import pathlib
import shutil

import numpy as np
import pytest

import switchzoo
from switchzoo.configs import mini
from switchzoo import evaluate, hf, loop, tables, tensorfile
from switchzoo.data import embedded

ERRORS = (ValueError, FileNotFoundError)


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
    return c


def translation_config(**fields):
    c = lm_config(**fields)
    c.model, c.task = fields.get("model", "switch_base_tiny"), "translation"
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
    pairs = embedded.harvest("de")[:200]
    (root / "good.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    (root / "notab.tsv").write_text("Open file\tDatei öffnen\nClose file Datei schließen\n")
    (root / "empty.tsv").write_text("")
    (root / "latin1.tsv").write_bytes("Größe\tsize\n".encode("latin-1"))
    return root


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    switchzoo.init(switchzoo.zoo.get("switch_base_tiny").replace(vocab_size=384)).save_pretrained(
        root / "good")
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
    (dict(mesh="data:3"), r"has 3 devices but 8 are available"),
    (dict(mesh="data:-1,model:-1"), r"more than one axis is -1"),
    (dict(layout="batch:data,heads"), r"entry 'heads' is not 'dim:axis'"),
    (dict(layout="bach:data"), r"unknown dimension 'bach' \(did you mean 'batch'\?\)"),
    (dict(layout="batch:dta", mesh="data:8"), r"mesh axis 'dta' \(did you mean 'data'\?\)"),
    (dict(layout="heads:model", mesh="data:1,model:8"),
     r"'heads' of size 4 is not divisible by mesh axes model \(8 devices\)"),
    (dict(layout="d_model:model,d_ff:model", mesh="data:1,model:8"),
     r"mesh axis 'model' is used by both 'd_model' and 'd_ff'"),
    (dict(optimizer="sgd"), r"unknown optimizer 'sgd'"),
    (dict(moe__top_k=0), r"top_k"),
    (dict(grad_accum_steps=3), r"grad_accum_steps=3 must be >= 1 and divide the global batch "
                               r"of 8 rows"),
    (dict(grad_accum_steps=0), r"grad_accum_steps=0 must be >= 1"),
]


@pytest.mark.parametrize("fields, message", RUN_CASES)
def test_run_level_mistakes(run, fields, message):
    before = snapshot(run)
    with pytest.raises(ERRORS, match=message) as info:
        loop.train(lm_config(**fields), run, print_fn=lambda *_: None)
    assert "\n" not in str(info.value)
    assert snapshot(run) == before


FRESH_CASES = [  # (config, message): a new workdir
    (lambda f, h: lm_config(task="classify"), r"unknown task 'classify'"),
    (lambda f, h: lm_config(model="switch_base_tiny"), r"task 'lm' needs a decoder-only model"),
    (lambda f, h: lm_config(model="dense_tiny", moe__top_k=2), r"dense model 'dense_tiny'"),
    (lambda f, h: lm_config(data__source="nowhere"), r"nowhere"),
    (lambda f, h: lm_config(data__pair="en-xx"), r"xx"),
    (lambda f, h: lm_config(per_device_batch_size=0), r"batch_size=0"),
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
    with pytest.raises(ERRORS, match=r"checkpoint 3 in .* cannot be restored.*left as it is"):
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
