"""Damaged files in a run's workdir, a damaged newest checkpoint, and a run's record kept true
(issue 34 items 4, 5 and 7), on real damaged files: each fault ends in a correct result or in
one line that names the file and what to do, and nothing is deleted. One trained tiny run is
shared; every case works on a copy of it."""
import json
import pathlib
import shutil
import subprocess
import struct
import sys

import pytest

from switchzoo import evaluate, loop, record, tables
from switchzoo.configs import mini

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUIET = lambda *_: None         # noqa: E731
FIELDS = dict(per_device_batch_size=1, max_length=32, eval_every_steps=0,
              checkpoint_every_steps=3, data__vocab_size=300, data__embedded_max_pairs=500,
              data__max_eval_examples=16)


def config(steps=6, **fields):
    c = mini.get_config(f"model=switch_tiny,steps={steps}")
    for key, value in {**FIELDS, **fields}.items():
        *parents, leaf = key.split("__")
        node = c
        for p in parents:
            node = node[p]
        node[leaf] = value
    c.data.locale_dir = "/nonexistent-catalogues"     # the shipped corpus alone: quicker
    return c


def train_py(steps, workdir) -> list[str]:
    """config(steps) as a train.py command."""
    return [sys.executable, "train.py", f"--config=configs/mini.py:model=switch_tiny,steps={steps}",
            f"--workdir={workdir}", "--config.data.locale_dir=/nonexistent-catalogues"] + [
        f"--config.{k.replace('__', '.')}={v}" for k, v in FIELDS.items()]


def snapshot(root: pathlib.Path) -> dict:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def committed(workdir) -> set[int]:
    return {int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("faults") / "run"
    loop.train(config(), workdir, print_fn=QUIET)
    assert committed(workdir) == {3, 6}
    return workdir


@pytest.fixture
def copy(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def edit_json(change):
    return lambda text: json.dumps(change(json.loads(text)), indent=2)


def without(key):
    return edit_json(lambda d: {k: v for k, v in d.items() if k != key})


DAMAGED = [   # (file, how it is damaged, the line that names it and what to do)
    ("tokenizer.model", lambda b: b[:len(b) // 3],
     r"tokenizer\.model is not a SentencePiece model: restore it from a copy of the run"),
    ("config.json", lambda t: t[:t.index('"learning_rate"')],
     r"config\.json is not valid JSON \(line \d+\): restore it from a copy of the run, or "
     r"start a new --workdir$"),
    ("config.json", edit_json(lambda d: {**d, "learning_rate": "fast"}),
     r"config\.json: learning_rate is \"fast\", not a number: restore it"),
    ("config.json", edit_json(lambda d: {**d, "data": 5}), r"config\.json: data is 5, not a "
     r"section of fields"),
    ("config.json", without("model"), r"config\.json lacks the field model: restore it"),
    ("config.json", lambda t: "[]", r"config\.json holds a JSON list, not an object"),
    ("model.json", lambda t: t[:-30], r"model\.json is not valid JSON \(line \d+\): restore it "
     r"from a copy of the run, or move it away"),
    ("model.json", edit_json(lambda d: {**d, "d_model": "64"}),
     r"model\.json is not a switchzoo model config \(d_model is '64'\)"),
    ("model.json", without("num_heads"), r"model\.json is not a switchzoo model config \(it "
     r"lacks num_heads\)"),
]


@pytest.mark.parametrize("name, damage, message", DAMAGED)
def test_a_damaged_workdir_file_is_named_with_what_to_do(copy, name, damage, message):
    path = copy / name
    path.write_bytes(damage(path.read_bytes())) if name.endswith(".model") else \
        path.write_text(damage(path.read_text()))
    before = snapshot(copy)
    with pytest.raises(ValueError, match=message) as resumed:      # train.py's resume
        loop.train(config(steps=7), copy, print_fn=QUIET)
    with pytest.raises(ValueError, match=message) as evaluated:    # eval.py
        evaluate.run(evaluate.load_config(copy), copy, print_fn=QUIET)
    assert "\n" not in str(resumed.value) + str(evaluated.value)
    assert str(copy / name) in str(resumed.value)
    assert snapshot(copy) == before


def test_a_missing_tokenizer_is_not_silently_trained_anew(copy):
    (copy / "tokenizer.model").unlink()
    before = snapshot(copy)
    message = r"tokenizer\.model is missing, but .* holds steps trained with it"
    with pytest.raises(ValueError, match=message):
        loop.train(config(steps=7), copy, print_fn=QUIET)
    with pytest.raises(ValueError, match=message):
        evaluate.run(evaluate.load_config(copy), copy, print_fn=QUIET)
    assert snapshot(copy) == before                 # no new tokenizer.model


@pytest.mark.parametrize("command, name, damage, message", [
    ("train.py", "tokenizer.model", lambda b: b"\0" * 64, "tokenizer.model is not a "
     "SentencePiece model"),
    ("eval.py", "config.json", edit_json(lambda d: {**d, "seed": "1"}), 'config.json: seed is '
     '"1", not an int'),
])
def test_the_commands_end_in_one_line_and_exit_2(copy, command, name, damage, message):
    path = copy / name
    path.write_bytes(damage(path.read_bytes())) if name.endswith(".model") else \
        path.write_text(damage(path.read_text()))
    args = train_py(7, copy) if command == "train.py" else [sys.executable, "eval.py",
                                                               f"--workdir={copy}"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_a_damaged_newest_checkpoint_names_the_step_that_restores_and_restore_step_starts_there(
        copy):
    for f in (copy / "checkpoints" / "6").rglob("*"):
        if f.is_file() and f.parent.name == "d":            # the array data files, cut
            f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
    before = snapshot(copy)
    # train.py: one line, no asyncio traceback from the reads still in flight
    out = subprocess.run(train_py(7, copy), cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[-1].startswith(f"error: checkpoint 6 in {copy / 'checkpoints'} is damaged ("), \
        lines
    assert lines[-1].endswith("step 3 is the newest that restores: resume from it with "
                              "--config.restore_step=3 (nothing was deleted; the checkpoints "
                              f"after it are then kept in {copy / 'checkpoints-after-3'})"), lines
    assert [x for x in lines if "error" in x.lower()] == lines[-1:], lines
    with pytest.raises(ValueError, match=r"checkpoint 6 .* is damaged .* evaluate from it with "
                                         r"--config.restore_step=3 \(nothing was deleted\)$"):
        evaluate.run(evaluate.load_config(copy), copy, print_fn=QUIET)
    with pytest.raises(ValueError, match=r"restore_step=5: .* holds no checkpoint 5 \(its "
                                         r"steps: 3, 6\); give one of them"):
        loop.train(config(steps=7, restore_step=5), copy, print_fn=QUIET)
    assert snapshot(copy) == before
    # evaluating step 3 needs nothing moved
    assert evaluate.run(evaluate.load_config(copy, {"restore_step": "3"}), copy,
                        print_fn=QUIET)["step"] == 3
    lines = []
    loop.train(config(steps=7, restore_step=3), copy, print_fn=lines.append)
    aside = copy / "checkpoints-after-3"
    assert f"restore_step=3: resuming from step 3; the newer checkpoints (6) are kept in " \
        f"{aside}, not resumed from" in lines and "resuming at step 3" in "".join(lines)
    damaged = {p: b for p, b in before.items() if (copy / "checkpoints" / "6") in p.parents}
    assert {aside / p.relative_to(copy / "checkpoints"): b for p, b in damaged.items()} == \
        {p: b for p, b in snapshot(aside).items()}                   # kept, byte for byte
    assert committed(copy) == {3, 6, 7}                             # saved again as usual
    assert json.loads((copy / "config.json").read_text())["restore_step"] is None
    # the same command again goes on from the newest, not back to 3
    lines = []
    loop.train(config(steps=8, restore_step=3), copy, print_fn=lines.append)
    assert "resuming at step 7" in "".join(lines) and committed(copy) == {6, 7, 8}


def test_a_resume_refuses_or_records_a_training_change_and_mends_a_cut_metrics_line(copy,
                                                                                    capfd):
    before = snapshot(copy)
    with pytest.raises(ValueError, match=r"trained to step 6 with other settings: learning_rate "
                                         r"0\.003 -> 0\.05, seed 0 -> 1; these change what is "
                                         r"trained: .* --config\.allow_changes=True"):
        loop.train(config(steps=7, learning_rate=0.05, seed=1), copy, print_fn=QUIET)
    assert snapshot(copy) == before
    metrics = copy / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[:-25])                      # a crash cut the last row
    lines = []
    loop.train(config(steps=7, learning_rate=0.05, allow_changes=True, log_every_steps=2,
                      eval_every_steps=4), copy, print_fn=lines.append)
    warned = [x for x in capfd.readouterr().err.splitlines() if x.startswith("warning:")]
    assert warned == [f"warning: the last line of {metrics} was cut (the run stopped while "
                      "writing it); it is ignored and logging goes on from the next line"]
    rows = metrics.read_text().splitlines()
    assert rows[len(text.splitlines()) - 1] == text[:-25].splitlines()[-1]   # the cut line
    assert json.loads(rows[-1])["step"] == 7 and all(json.loads(r) for r in rows[len(
        text.splitlines()):])
    saved = json.loads((copy / "config.json").read_text())
    # the training change is recorded at the step it took effect; the others pass silently
    assert saved["changes"] == [{"step": 6, "field": "learning_rate", "old": 0.003,
                                 "new": 0.05}]
    assert (saved["learning_rate"], saved["log_every_steps"], saved["allow_changes"]) == \
        (0.05, 2, False)
    assert f"allow_changes: recorded in {copy / 'config.json'} from step 6: learning_rate " \
        "0.003 -> 0.05" in lines
    # the same settings again are no change; eval.py reads the record (changes are no field)
    assert record.changed(copy, config(steps=8, learning_rate=0.05))[0] == []
    assert evaluate.load_config(copy).learning_rate == 0.05


def test_evaluation_on_other_data_keeps_the_runs_own_results(copy, tmp_path):
    lines = []
    evaluate.run(evaluate.load_config(copy), copy, print_fn=lines.append)
    own = (copy / "results.json").read_text()
    assert f"results: {copy / 'results.json'} (the run's own evaluation set)" in lines
    other = tmp_path / "other.txt"
    other.write_text("".join(f"Open the file number {i} and save it.\n" for i in range(12)))
    lines = []
    out = evaluate.run(evaluate.load_config(copy, {"data.eval_files": str(other)}), copy,
                       print_fn=lines.append)
    [written] = copy.glob("results-other-*.json")
    assert (copy / "results.json").read_text() == own
    assert json.loads(written.read_text())["loss"] == out["loss"] != json.loads(own)["loss"]
    assert f"results: {written} (another evaluation set (data.eval_files='{other}'); the " \
        "run's own stay in results.json)" in lines
    # the paper tables read the run's own
    assert tables.load_run(copy)["results"] == json.loads(own)


def test_a_vocabulary_named_by_another_path_is_no_change_another_vocabulary_is(tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "a.model").write_bytes(b"pieces")
    (tmp_path / "b.model").write_bytes(b"other pieces")
    same = record.NEUTRAL_BETWEEN["data.vocab_path"]
    assert same("v/a.model", str(tmp_path / "v" / "a.model"))      # relative vs absolute
    assert not same("v/a.model", "b.model")                          # other bytes
    assert not same("v/a.model", "missing.model") and not same("", "v/a.model")


def test_a_resume_on_other_devices_is_judged_by_its_global_batch(copy):
    """config.json records per_device_batch_size x devices. The run was trained on this
    process's 8 devices with 1 row each; its record is edited as if trained elsewhere."""
    saved = json.loads((copy / "config.json").read_text())
    assert saved["global_batch_size"] == 8
    # trained on 4 devices x 2 rows: 8 devices x 1 row read the same 8 rows, accepted
    (copy / "config.json").write_text(json.dumps({**saved, "per_device_batch_size": 2}))
    assert record.changed(copy, config(steps=7))[0] == []
    # trained on 4 devices x 1 row: 8 devices x 1 row is another batch, refused
    (copy / "config.json").write_text(json.dumps({**saved, "global_batch_size": 4}))
    before = snapshot(copy)
    with pytest.raises(ValueError, match=r"trained to step 6 with other settings: "
                                         r"global_batch_size 4 -> 8; these change what is "
                                         r"trained"):
        loop.train(config(steps=7), copy, print_fn=QUIET)
    assert snapshot(copy) == before


def params_file(workdir, step):
    """The largest array data file of checkpoint ``step``'s parameters."""
    files = [f for f in (workdir / "checkpoints" / str(step) / "params").rglob("*")
             if f.is_file() and f.parent.name == "d"]
    return max(files, key=lambda f: f.stat().st_size)


DAMAGE = {      # one array file of the newest checkpoint
    "cut_to_1000_bytes": lambda b: b[:1000],
    "cut_to_half": lambda b: b[:len(b) // 2],
    "64_bytes_overwritten": lambda b: b[:len(b) // 2] + bytes(range(64)) + b[len(b) // 2 + 64:],
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_one_damaged_array_file_is_named_and_never_trained_on(copy, how):
    """One array file of step 6 cut short, or 64 bytes inside it overwritten (which Orbax
    restores without a word): train.py's resume and eval.py both stop in one line naming step 6
    and the step that restores, from the integrity record written with each checkpoint."""
    assert (copy / "checkpoints-integrity" / "6.json").is_file()
    target = params_file(copy, 6)
    target.write_bytes(DAMAGE[how](target.read_bytes()))
    before = snapshot(copy)
    line = (r"checkpoint 6 in .* is damaged \(.*\); step 3 is the newest that restores: "
            r"{} from it with --config.restore_step=3 \(nothing was deleted")
    with pytest.raises(ValueError, match=line.format("resume")):
        loop.train(config(steps=7), copy, print_fn=QUIET)
    with pytest.raises(ValueError, match=line.format("evaluate")):
        evaluate.run(evaluate.load_config(copy), copy, print_fn=QUIET)
    assert snapshot(copy) == before


def tb_events(directory: pathlib.Path) -> list:
    """The events of one TensorBoard file (TFRecord: length, crc, data, crc), as protos."""
    from tensorboardX.proto import event_pb2
    blob, events, at = directory.read_bytes(), [], 0
    while at < len(blob):
        (n,) = struct.unpack("<Q", blob[at:at + 8])
        events.append(event_pb2.Event.FromString(blob[at + 12:at + 12 + n]))
        at += 12 + n + 4
    return events


def test_steps_replayed_after_a_lost_checkpoint_are_recorded_once(copy):
    """A crash lost checkpoint 6 after its steps were logged: the resume from 3 trains 4-6
    again; metrics.jsonl holds each step once (the replay's rows; the replaced ones kept in
    metrics-replaced-after-3.jsonl) and TensorBoard is told to drop the old events from step 4."""
    old = [r for r in map(json.loads, (copy / "metrics.jsonl").open()) if r["split"] == "train"]
    shutil.rmtree(copy / "checkpoints" / "6")
    loop.train(config(steps=7), copy, print_fn=QUIET)
    rows = [r for r in map(json.loads, (copy / "metrics.jsonl").open()) if r["split"] == "train"]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 7
    replaced = [json.loads(x) for x in (copy / "metrics-replaced-after-3.jsonl").open()]
    assert [r["step"] for r in replaced] == [r["step"] for r in old if r["step"] > 3]
    newest = max((copy / "tensorboard").glob("events.*"), key=lambda p: p.stat().st_mtime_ns)
    purge = [e for e in tb_events(newest) if e.HasField("session_log")]
    assert purge and purge[0].session_log.status == purge[0].session_log.START
    assert purge[0].step == 4
