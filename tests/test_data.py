"""Input pipelines: sources, tokenizer cache, packing, determinism, resume, errors."""
import gzip
import json
import struct

import grain
import numpy as np
import pytest

from switchzoo import cache, data
from switchzoo.data import embedded, files, pipeline, tfds_local
from switchzoo.data import tokenizer as tokenizer_lib

B, L, VOCAB = 4, 32, 300


@pytest.fixture(scope="module")
def pairs():
    """Real short English-German pairs of the shipped gettext corpus."""
    shipped = embedded.shipped("de")
    return [p for p in shipped if len(p[0]) < 60 and p[0].isascii()][::7][:1200]


@pytest.fixture(scope="module")
def corpus(pairs, tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    files.write_tsv(root / "train.tsv", pairs[:-40])
    with gzip.open(root / "train2.tsv.gz", "wt", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in pairs[-40:-20])
    files.write_tsv(root / "eval.tsv", pairs[-20:])
    (root / "lm.txt").write_text("".join(s + "\n" for s, _ in pairs[:-40]), encoding="utf-8")
    (root / "lm_eval.txt").write_text("".join(s + "\n" for s, _ in pairs[-20:]))
    return root


def config(**overrides):
    cfg = data.default_config()
    cfg.vocab_size = VOCAB
    cfg.update(overrides)
    return cfg


def files_config(corpus, task="translation"):
    if task == "lm":
        return config(source="files", train_files=str(corpus / "lm.txt"),
                      eval_files=str(corpus / "lm_eval.txt"))
    return config(source="files", train_files=f"{corpus / 'train.tsv'},{corpus / 'train2.tsv.gz'}",
                  eval_files=str(corpus / "eval.tsv"))


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_same(batches_a, batches_b):
    for a, b in zip(batches_a, batches_b, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def segment_ids(batch, side, segments):
    """{(row, segment): ids} of one side of a packed batch."""
    out = {}
    for r, row in enumerate(batch[segments]):
        for s in np.unique(row[row > 0]):
            out[(r, s)] = batch[side][r][row == s]
    return out


def write_mo(path, pairs, charset="UTF-8", big_endian=False):
    """A compiled gettext catalogue (GNU .mo format), written from scratch: header first."""
    entries = [(b"", f"Content-Type: text/plain; charset={charset}\n".encode("ascii"))]
    entries += sorted((k.encode("utf-8"), v.encode(charset)) for k, v in pairs)
    order, n = ">" if big_endian else "<", len(entries)
    ids_at, strs_at = 28, 28 + 8 * n
    blob_at = strs_at + 8 * n
    tables, blob = [b"", b""], b""
    for side in (0, 1):
        for entry in entries:
            tables[side] += struct.pack(order + "2I", len(entry[side]), blob_at + len(blob))
            blob += entry[side] + b"\0"
    header = struct.pack(order + "7I", 0x950412DE, 0, n, ids_at, strs_at, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + tables[0] + tables[1] + blob)


def test_shipped_corpus_is_real_and_travels(tmp_path):
    shipped = embedded.shipped("de")
    assert len(shipped) > 50_000 and shipped == sorted(set(shipped))
    assert sum(e != g for e, g in shipped) > 0.5 * len(shipped)      # mostly translated
    assert all("\t" not in e + g and "\n" not in e + g for e, g in shipped)
    assert "de" in embedded.shipped_langs()
    # A machine with no catalogues (Debian slim): the shipped corpus alone.
    empty = tmp_path / "locale"
    empty.mkdir()
    train, held, said = embedded.load("en-de", "translation", tmp_path, max_pairs=500,
                                      locale_dir=empty)
    assert "53,474 shipped pairs + 0 from" in said
    assert len(train) == 500 and 0 < len(held) < 0.05 * len(shipped)
    assert not {e for e, _ in train} & {e for e, _ in held}
    assert (tmp_path / "embedded-en-de.tsv").is_file()                  # cached for resume
    flipped, _, _ = embedded.load("de-en", "translation", tmp_path, max_pairs=500)
    assert flipped == [(g, e) for e, g in train]
    d = data.build(config(embedded_max_pairs=2000, locale_dir=str(empty)), tmp_path / "run",
                   batch_size=B, max_length=L)
    assert next(d.train)["weights"].sum() > 0 and len(d.eval_examples) > 100


def test_host_catalogues_add_to_the_shipped_corpus(tmp_path):
    write_mo(tmp_path / "de/LC_MESSAGES/tool.mo", [
        ("Open the _file", "_Datei öffnen"), ("%s: %d", "%s: %d"), ("Quit", "Beenden")])
    write_mo(tmp_path / "de_AT/LC_MESSAGES/other.mo", [("January", "Jänner")],
             charset="ISO-8859-1", big_endian=True)
    assert embedded.harvest("de", tmp_path) == [
        ("January", "Jänner"), ("Open the file", "Datei öffnen"), ("Quit", "Beenden")]
    pairs, said = embedded.corpus("de", tmp_path)
    assert set(pairs) == set(embedded.shipped("de")) | {("January", "Jänner"),
                                                         ("Open the file", "Datei öffnen")}
    assert said.endswith(f"+ 2 from the catalogues in {tmp_path}")   # Quit/Beenden is shipped
    write_mo(tmp_path / "sv/LC_MESSAGES/tool.mo", [("Quit", "Avsluta")])
    assert embedded.corpus("sv", tmp_path)[0] == [("Quit", "Avsluta")]   # host catalogues alone


def test_embedded_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="ships en-de and .* no 'xx' gettext catalogues"
                       ".*--config.data.source=files"):
        embedded.load("en-xx", "translation", None, locale_dir=tmp_path)
    with pytest.raises(ValueError, match="en-XX"):
        embedded.load("de-fr", "translation", None)


@pytest.mark.parametrize("task", ["translation", "lm"])
def test_local_files(corpus, pairs, tmp_path, task):
    d = data.build(files_config(corpus, task), tmp_path, task=task, batch_size=B, max_length=L)
    batch = next(d.train)
    fields = (["inputs_segments", "targets_segments", "inputs_positions", "targets_positions"]
              if task == "translation" else ["segments", "positions"])
    assert sorted(batch) == sorted(["inputs", "targets", "weights", *fields])
    assert all(v.shape == (B, L) for v in batch.values())
    assert batch["inputs"].dtype == np.int32 and batch["weights"].dtype == np.float32
    expected = pairs[-20:] if task == "translation" else [s for s, _ in pairs[-20:]]
    assert d.eval_examples == expected
    if task == "lm":    # targets are the inputs shifted by one within every segment
        same = (batch["segments"][:, 1:] == batch["segments"][:, :-1]) & (batch["segments"][:, 1:] > 0)
        np.testing.assert_array_equal(batch["inputs"][:, 1:][same], batch["targets"][:, :-1][same])
        assert (batch["inputs"][batch["positions"] == 0][batch["segments"][batch["positions"] == 0] > 0]
                == tokenizer_lib.EOS_ID).all()


def test_tfds_builder_prepared_from_local_files(corpus, pairs, tmp_path):
    import tensorflow_datasets as tfds
    name = tfds_local.prepare("translation", f"{corpus / 'train.tsv'},{corpus / 'train2.tsv.gz'}",
                              str(corpus / "eval.tsv"), str(tmp_path / "tfds"))
    assert list((tmp_path / "tfds").glob("local_text/translation/1.0.0/*.array_record*"))
    source = tfds.data_source(name, split="train", data_dir=str(tmp_path / "tfds"))
    read = sorted((r["source"].decode(), r["target"].decode()) for r in source)
    assert read == sorted(pairs[:-20])
    cfg = config(source="tfds", tfds_name=name, tfds_data_dir=str(tmp_path / "tfds"))
    d = data.build(cfg, tmp_path / "run", batch_size=B, max_length=L)
    assert sorted(d.eval_examples) == sorted(pairs[-20:])
    assert next(d.train)["weights"].sum() > 0


def test_tokenizer_trained_cached_and_reused(corpus, tmp_path, monkeypatch):
    cfg = files_config(corpus)
    d = data.build(cfg, tmp_path, batch_size=B, max_length=L)
    cached = tmp_path / tokenizer_lib.CACHE_NAME
    assert cached.is_file() and d.tokenizer.num_pieces == VOCAB
    assert d.tokenizer.vocab_size == VOCAB + tokenizer_lib.EXTRA_IDS     # T5's 100 sentinels
    assert (d.tokenizer.pad_id, d.tokenizer.eos_id) == (0, 1)
    text = "the cat is green"
    ids = d.tokenizer.encode(text)
    assert tokenizer_lib.EOS_ID not in ids and d.tokenizer.decode(ids + [1, 5, 6]) == text
    assert d.tokenizer.decode([0] + ids + [0]) == text
    monkeypatch.setattr(tokenizer_lib, "train", lambda *a, **k: pytest.fail("retrained"))
    again = data.build(cfg, tmp_path, batch_size=B, max_length=L)
    assert again.tokenizer.encode(text) == ids
    from_path = data.build(config(**{**cfg.to_dict(), "vocab_path": str(cached)}), None,
                           batch_size=B, max_length=L)
    assert from_path.tokenizer.encode(text) == ids
    cfg.vocab_size = VOCAB + 1
    with pytest.raises(ValueError, match="vocab_size"):
        data.build(cfg, tmp_path, batch_size=B, max_length=L)


def test_packing_keeps_every_example_once_without_leakage(corpus, tmp_path):
    d = data.build(files_config(corpus), tmp_path, batch_size=B, max_length=L)
    featurize = pipeline.featurizer(d.tokenizer, "translation", L)
    examples = [featurize(e) for e in d.eval_examples]
    finite = grain.MapDataset.source(examples).to_iter_dataset()
    seen = []
    for batch in pipeline.pack(finite, "translation", B, L, seed=0):
        for side in ("inputs", "targets"):
            segments, positions = batch[f"{side}_segments"], batch[f"{side}_positions"]
            for row_s, row_p in zip(segments, positions):
                used = int((row_s > 0).sum())
                assert (row_s[:used] > 0).all() and row_s[0] == 1      # padding only at the end
                assert set(np.diff(row_s[:used])) <= {0, 1}             # segments 1, 2, 3, ...
                for s in range(1, row_s.max() + 1):                     # positions restart
                    np.testing.assert_array_equal(row_p[row_s == s], np.arange((row_s == s).sum()))
        sources = segment_ids(batch, "inputs", "inputs_segments")
        targets = segment_ids(batch, "targets", "targets_segments")
        assert sources.keys() == targets.keys()
        seen += [(tuple(sources[k]), tuple(targets[k])) for k in sources]
        np.testing.assert_array_equal(batch["weights"], batch["targets_segments"] > 0)
    expected = [(tuple(e["inputs"]), tuple(e["targets"])) for e in examples]
    assert sorted(seen) == sorted(expected)       # each source still with its own target


def test_train_is_deterministic_endless_and_resumable(corpus, tmp_path):
    cfg = files_config(corpus, "lm")
    first = data.build(cfg, tmp_path, task="lm", batch_size=B, max_length=L, seed=3)
    second = data.build(cfg, tmp_path, task="lm", batch_size=B, max_length=L, seed=3)
    assert_same(take(first.train, 3), take(second.train, 3))
    other = data.build(cfg, tmp_path, task="lm", batch_size=B, max_length=L, seed=4)
    assert not np.array_equal(next(other.train)["inputs"], next(first.train)["inputs"])
    take(first.train, 150)                                   # several epochs in
    state = first.train.get_state()
    assert state == json.loads(json.dumps(state))
    expected = take(first.train, 3)
    resumed = data.build(cfg, tmp_path, task="lm", batch_size=B, max_length=L, seed=3)
    resumed.train.set_state(state)
    assert_same(take(resumed.train, 3), expected)
    wider = data.build(cfg, tmp_path, task="lm", batch_size=B + 1, max_length=L, seed=3)
    wider.train.set_state(state)          # another batch: the stream restarts, and says where
    assert "every stream restarts at example" in wider.train.reshaped
    wrong = data.build(cfg, tmp_path, task="lm", batch_size=B, max_length=L + 1, seed=3)
    with pytest.raises(ValueError, match="max_length"):
        wrong.train.set_state(state)


@pytest.mark.parametrize("task", ["translation", "lm"])
def test_eval_batches_finite_deterministic_unpacked(corpus, tmp_path, task):
    d = data.build(files_config(corpus, task), tmp_path, task=task, batch_size=3, max_length=L)
    batches = list(d.eval_batches())
    assert_same(batches, list(d.eval_batches()))
    assert len(batches) == 7                                       # 20 examples, 3 per batch
    last = batches[-1]
    assert last["weights"][2:].sum() == 0 and last["weights"][:2].max(axis=1).min() == 1
    segments = "targets_segments" if task == "translation" else "segments"
    assert all(b[segments].max() <= 1 for b in batches)
    targets = [t for b in batches for t in b["targets"]][:20]
    references = [e[1] if task == "translation" else e for e in d.eval_examples]
    assert [d.tokenizer.decode(t) for t in targets] == [
        d.tokenizer.decode(d.tokenizer.encode(r)[:L - 1]) for r in references]
    if task == "lm":
        words = np.concatenate([b["num_words"] for b in batches])
        # one end-of-sentence per text counts as a word (LM1B), as the loss predicts it
        assert words.tolist() == [len(r.split()) + 1 for r in references] + [0]


def test_bad_inputs_fail_with_a_fix(corpus, tmp_path):
    def build(**overrides):
        return data.build(config(**overrides), tmp_path / "run", batch_size=B, max_length=L)
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        build(source="files", train_files=str(tmp_path / "missing.tsv"))
    (tmp_path / "empty.tsv").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        build(source="files", train_files=str(tmp_path / "empty.tsv"))
    (tmp_path / "bad.tsv").write_text("a\tb\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: .*exactly one TAB"):
        build(source="files", train_files=str(tmp_path / "bad.tsv"))
    (tmp_path / "latin1.tsv").write_bytes("Gr\xfc\xdfe\tgreetings\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.tsv:1: .*UTF-8"):
        build(source="files", train_files=str(tmp_path / "latin1.tsv"))
    with pytest.raises(ValueError, match="unknown data.source 'hdfs'"):
        build(source="hdfs")
    for name in ("local_text/translation", "wmt14_translate/de-en"):
        with pytest.raises(ValueError, match="not prepared.*train_files"):
            build(source="tfds", tfds_name=name, tfds_data_dir=str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="vocab_size to at most"):
        build(source="files", train_files=str(corpus / "eval.tsv"), vocab_size=8000)
    with pytest.raises(FileNotFoundError, match="vocab_path"):
        build(source="files", train_files=str(corpus / "train.tsv"), vocab_path="/nope.model")


def test_a_kept_tokenizer_and_harvest_are_what_a_rebuild_gives(tmp_path, monkeypatch):
    """switchzoo.data.memo: the bytes kept for a tokenizer's training text and settings, and for
    a set of catalogues, are the bytes a rebuild in a fresh process gives; another text, vocab
    size or catalogue (a changed file) is another key; an unwritable cache is passed over."""
    from switchzoo.data import memo
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(memo, "_PROCESS", {})
    texts = [t for _, t in embedded.shipped("de")[:3000]]
    first = tokenizer_lib.train(texts, 400)
    assert len(list((tmp_path / "cache" / "data").glob("tokenizer-*"))) == 1
    monkeypatch.setattr(memo, "_PROCESS", {})                 # a new process: read from disk
    monkeypatch.setattr(tokenizer_lib, "_train", lambda *a: pytest.fail("retrained"))
    assert tokenizer_lib.train(iter(texts), 400) == first
    monkeypatch.undo()                                        # no cache at all: a rebuild
    monkeypatch.setattr(memo, "_PROCESS", {})
    monkeypatch.setenv(cache.ENV, "")                         # nothing kept on disk
    assert tokenizer_lib.train(texts, 400) == first
    from switchzoo.planner import search       # by the layout search either (not ./layouts)
    assert search.cache_dir() is None
    assert len(list((tmp_path / "cache" / "data").glob("tokenizer-*"))) == 1
    assert tokenizer_lib.train(texts[1:], 400) != first       # another text, another model
    assert tokenizer_lib.Tokenizer(tokenizer_lib.train(texts, 401), None).num_pieces == 401

    locale = tmp_path / "locale"
    write_mo(locale / "de/LC_MESSAGES/tool.mo", [("Quit", "Beenden")])
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    assert embedded.harvest("de", locale) == [("Quit", "Beenden")]
    write_mo(locale / "de/LC_MESSAGES/tool.mo", [("Open", "Öffnen"), ("Quit", "Beenden")])
    assert embedded.harvest("de", locale) == [("Open", "Öffnen"), ("Quit", "Beenden")]
    (tmp_path / "ro").write_text("a file where the cache's folder would go")
    monkeypatch.setenv(cache.ENV, str(tmp_path / "ro"))
    monkeypatch.setattr(memo, "_PROCESS", {})
    assert tokenizer_lib.train(texts, 400) == first
