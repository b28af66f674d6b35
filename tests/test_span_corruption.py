"""T5 span corruption: counts as T5's random_spans_noise_mask, sentinels from the top of the
vocabulary, inputs and targets that interleave back into the original, boundaries uniformly
random, and T5's length arithmetic; the span_corruption task's pipeline (vocabulary with 100
extra ids, packed rows that rebuild the text, exact resume, short texts skipped, bad settings)."""
import collections
import json

import numpy as np
import pytest
import sentencepiece as spm

from switchzoo import data, validate
from switchzoo.configs import base
from switchzoo.data import embedded, pipeline
from switchzoo.data import span_corruption as sc
from switchzoo.data import tokenizer as tokenizer_lib

V = 1000


def rebuild(inputs, targets, vocab_size=V):
    """The original sequence: each sentinel of the inputs replaced by what follows it in the
    targets (up to the next sentinel)."""
    V = vocab_size
    pieces, current = {}, None
    for t in targets:
        if t >= V - sc.NUM_SENTINELS:
            current = int(t)
            pieces[current] = []
        else:
            pieces[current].append(int(t))
    out = []
    for t in inputs:
        out += pieces[int(t)] if t >= V - sc.NUM_SENTINELS else [int(t)]
    return out


@pytest.mark.parametrize("density, mean", [(0.15, 3.0), (0.5, 1.0), (0.3, 8.0)])
def test_counts_sentinels_and_the_round_trip(density, mean):
    rng = np.random.default_rng(0)
    for n in list(range(2, 80)) + [568] * (density == 0.15):
        ids = rng.integers(1, V - sc.NUM_SENTINELS, n)
        mask = sc.noise_mask(n, density, mean, rng)
        noise = min(max(round(n * density), 1), n - 1)
        spans = min(max(round(noise / mean), 1), n - noise)
        starts = mask & ~np.concatenate([[False], mask[:-1]])
        assert mask.sum() == noise and starts.sum() == spans and not mask[0], n
        inputs, targets = sc.corrupt(ids, vocab_size=V, noise_density=density,
                                     mean_noise_span_length=mean, rng=np.random.default_rng(n))
        assert inputs.dtype == targets.dtype == np.int32
        assert len(inputs) == n - noise + spans and len(targets) == noise + spans
        sentinels = [t for t in inputs if t >= V - sc.NUM_SENTINELS]
        assert sentinels == list(range(V - 1, V - 1 - spans, -1))      # <extra_id_0> = V - 1
        assert [t for t in targets if t >= V - sc.NUM_SENTINELS] == sentinels
        assert targets[0] == V - 1                 # the targets open with the first sentinel
        assert rebuild(inputs, targets) == ids.tolist()


def test_span_boundaries_are_uniformly_random():
    # n=10 at 0.3 / 1.5: 3 noise tokens in 2 spans, 7 kept in 2 runs -> 2 x 6 = 12 masks, each
    # equally likely.
    rng = np.random.default_rng(1)
    seen = collections.Counter(sc.noise_mask(10, 0.3, 1.5, rng).tobytes() for _ in range(6000))
    assert len(seen) == 12
    assert max(seen.values()) < 1.2 * 500 and min(seen.values()) > 0.8 * 500


def test_t5_length_arithmetic():
    assert sc.lengths(512) == (568, 114)        # T5 / Switch: 512 inputs, 114 targets
    for inputs_length in (64, 128, 512, 1024):
        raw, targets_length = sc.lengths(inputs_length)
        inputs, targets = sc.corrupt(np.arange(1, raw + 1), vocab_size=V * 10,
                                     rng=np.random.default_rng(0))
        assert (len(inputs) + 1, len(targets) + 1) == (inputs_length, targets_length)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="noise_density=1.5 must be in"):
        sc.corrupt([1, 2, 3], vocab_size=V, noise_density=1.5, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="more than the 100 sentinel ids"):
        sc.corrupt(np.arange(1, 5000), vocab_size=10_000, rng=np.random.default_rng(0))


# ------------------------------------------------------------------ the span_corruption task

B, L = 4, 32
RAW, T = sc.lengths(L)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Real English: short gettext messages, and long documents made of 30 of them each (several
    chunks of RAW tokens); a training file and an evaluation file, one document per line."""
    english = [e for e, _ in embedded.shipped("de") if e.isascii()][::9][:1500]
    long_docs = [" ".join(english[i:i + 30]) for i in range(0, 300, 30)]
    root = tmp_path_factory.mktemp("texts")
    (root / "train.txt").write_text("\n".join(english[300:1400] + long_docs) + "\n")
    (root / "eval.txt").write_text("\n".join(english[1400:1480] + long_docs[:2]) + "\n")
    return root


def build(texts, workdir, seed=0, **overrides):
    cfg = data.default_config()
    cfg.update(dict(source="files", train_files=str(texts / "train.txt"),
                    eval_files=str(texts / "eval.txt"), vocab_size=400, **overrides))
    return data.build(cfg, workdir, task="span_corruption", batch_size=B, max_length=L,
                      seed=seed)


def split_segments(batch, side):
    out = {}
    for r, row in enumerate(batch[f"{side}_segments"]):
        for seg in np.unique(row[row > 0]):
            out[(r, seg)] = batch[side][r][row == seg]
    return out


def test_vocabulary_reserves_t5_sentinels_at_the_top(texts, tmp_path):
    d = build(texts, tmp_path)
    tok = d.tokenizer
    assert tok.num_pieces == 400 and tok.vocab_size == 400 + sc.NUM_SENTINELS
    assert tok.sentinel(0) == tok.vocab_size - 1 and tok.sentinel(99) == tok.num_pieces
    ids = tok.encode("Hello world") + [tok.sentinel(0)] + tok.encode("again")
    assert tok.decode(ids) == "Hello world<extra_id_0>again"
    with pytest.raises(ValueError, match="extra_id_100"):
        tok.sentinel(100)
    # a SentencePiece model that holds its own sentinels low in the vocabulary is refused
    model = tmp_path / "own.model"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter((texts / "train.txt").read_text().splitlines()),
        model_prefix=str(model.with_suffix("")), vocab_size=300, pad_id=0, eos_id=1, unk_id=2,
        bos_id=-1, user_defined_symbols=["<extra_id_0>", "<extra_id_1>"], minloglevel=2)
    with pytest.raises(ValueError, match=r"<extra_id_0> at id 3, not at 299"):
        tokenizer_lib.Tokenizer(model.read_bytes(), str(model))
    # too few sentinels for the chunks' spans: refused naming the fix
    few = tokenizer_lib.Tokenizer(tok.proto)
    few.num_sentinels = 3
    with pytest.raises(ValueError, match=r"makes up to 11 spans but .* has 3 sentinel ids .* "
                                         r"100 extra ids"):
        pipeline.SpanFeaturizer(few, 200, 0.15, 3.0)


def test_packed_rows_rebuild_the_documents(texts, tmp_path):
    d = build(texts, tmp_path)
    V = d.tokenizer.vocab_size
    assert d.target_length == T and (RAW, T) == (34, 8)
    chunks = set()
    for line in (texts / "train.txt").read_text().splitlines():
        ids = d.tokenizer.encode(line)
        chunks |= {tuple(ids[i:i + RAW]) for i in range(0, len(ids), RAW) if len(ids[i:]) >= 2}
    seen = 0
    for _ in range(20):
        batch = next(d.train)
        assert batch["inputs"].shape == (B, L) and batch["targets"].shape == (B, T)
        assert all(batch[k].shape == (B, T) for k in ("targets_segments", "weights"))
        inputs, targets = split_segments(batch, "inputs"), split_segments(batch, "targets")
        assert inputs.keys() == targets.keys()
        for key in inputs:
            src, tgt = inputs[key], targets[key]
            assert src[-1] == tgt[-1] == tokenizer_lib.EOS_ID
            assert tgt[0] == V - 1          # targets start with <extra_id_0>
            assert tuple(rebuild(src[:-1], tgt[:-1], V)) in chunks
            seen += 1
    assert seen > 40
    # evaluation: one example per row, every held-out document rebuilt in order
    rows = [(s[s > 0], t[t > 0]) for b in d.eval_batches()
            for s, t in zip(b["inputs"], b["targets"]) if t.any()]
    rebuilt = [rebuild(s[:-1], t[:-1], V) for s, t in rows]
    expected = [c for line in d.eval_examples for ids in [d.tokenizer.encode(line)]
                for c in [ids[i:i + RAW] for i in range(0, len(ids), RAW)] if len(c) >= 2]
    assert rebuilt == expected and len(expected) > len(d.eval_examples)   # long ones chunked
    again = [(s[s > 0], t[t > 0]) for b in build(texts, tmp_path).eval_batches()
             for s, t in zip(b["inputs"], b["targets"]) if t.any()]
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(rows, again, strict=True))          # a fixed draw


def test_resume_mid_document_is_exact(texts, tmp_path):
    first = build(texts, tmp_path, seed=5)
    for _ in range(37):
        next(first.train)
    state = first.train.get_state()
    assert state == json.loads(json.dumps(state))
    expected = [next(first.train) for _ in range(4)]
    resumed = build(texts, tmp_path, seed=5)
    resumed.train.set_state(state)
    for a, b in zip(expected, [next(resumed.train) for _ in range(4)]):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    other = build(texts, tmp_path, seed=6)
    assert not np.array_equal(next(other.train)["inputs"], expected[0]["inputs"])


def test_short_texts_are_skipped_and_counted(texts, tmp_path):
    tok = build(texts, tmp_path).tokenizer
    word = next(w for w in ("the", "file", "a", "to") if len(tok.encode(w)) == 1)
    featurize = pipeline.SpanFeaturizer(tok, L, 0.15, 3.0)
    assert featurize(word, np.random.default_rng(0)) == [] and featurize.skipped == 1
    assert len(featurize(word + " " + word, np.random.default_rng(0))) == 1


@pytest.mark.parametrize("field, value, message", [
    ("data.noise_density", 1.5, r"noise_density=1.5 is out of range: it must be > 0 and < 1"),
    ("data.noise_density", 0.0, r"noise_density=0.0 is out of range"),
    ("data.mean_noise_span_length", 0.5, r"mean_noise_span_length=0.5 .* >= 1"),
])
def test_bad_noise_settings_are_config_errors(field, value, message):
    c = base.get_base()
    c.task = "span_corruption"
    base.set_field(c, field, str(value))
    with pytest.raises(ValueError, match=message):
        validate.check(c)


def test_noise_settings_unread_outside_span_corruption():
    c = base.get_base()
    c.data.noise_density = 0.3
    with pytest.raises(ValueError, match=r"noise_density=0.3 is read only with task=span_"
                                         r"corruption, and this run has task=translation"):
        validate.check(c)


@pytest.mark.parametrize("density, mean", [(0.15, 3.0), (0.05, 3.0), (0.15, 10.0), (0.5, 1.0)])
def test_lengths_hold_every_chunk_at_every_length(density, mean):
    """Rows of lengths(L) hold the corrupted chunks (plus EOS) of every raw length up to it."""
    rng = np.random.default_rng(0)
    for L in range(3, 90):
        raw, T = sc.lengths(L, density, mean)
        assert raw >= 2                          # max_length 3 already holds a chunk
        for m in {2, raw // 2, raw - 1, raw} - {0, 1}:
            inputs, targets = sc.corrupt(np.arange(5, 5 + m), vocab_size=V, noise_density=density,
                                         mean_noise_span_length=mean, rng=rng)
            assert len(inputs) + 1 <= L and len(targets) + 1 <= T, (L, m)
    with pytest.raises(ValueError, match="max_length=2 leaves no room .* at least 3"):
        pipeline.SpanFeaturizer(None, 2, 0.15, 3.0)


def test_embedded_span_corruption_adds_the_gnu_manuals(tmp_path):
    """The embedded corpus's English side plus the manuals of --config.data.info_dir (prose
    paragraphs only), cached in the workdir; info_dir is refused where nothing reads it."""
    import gzip
    info = tmp_path / "info"
    info.mkdir()
    prose = ("The sort command writes the sorted concatenation of all files to standard output, "
             "and with no file it reads standard input instead.")
    cut = prose.index(" ", 55)                # the paragraph spans two lines
    manual = ("\x1f\nFile: sort.info, Node: sort invocation, Up: Top\n\n"
              f"{prose[:cut]}\n{prose[cut + 1:]}\n\n* Menu:\n\n* sort invocation::  Sorting.\n\n"
              "'-k POS1[,POS2]'\n     -k 2,2n -t :\n")
    with gzip.open(info / "sort.info.gz", "wt") as f:
        f.write(manual)
    cfg = data.default_config()
    cfg.update(dict(vocab_size=400, embedded_max_pairs=2000, locale_dir=str(tmp_path / "none"),
                    info_dir=str(info)))
    d = data.build(cfg, tmp_path / "run", task="span_corruption", batch_size=B, max_length=L)
    assert d.description.endswith(f"+ 1 paragraphs of the GNU manuals in {info} (1 files)")
    corpus = data.sources.load(cfg, "span_corruption", tmp_path / "run")
    assert prose in list(corpus.train) + corpus.eval          # joined, menus and tables dropped
    assert (tmp_path / "run" / "data" / "manuals.txt").read_text() == prose + "\n"
    again = data.build(cfg, tmp_path / "run", task="span_corruption", batch_size=B, max_length=L)
    assert "1 paragraphs of GNU manuals cached in" in again.description
    c = base.get_base()
    c.data.info_dir = str(info)
    with pytest.raises(ValueError, match=r"info_dir=.* is read only with task=span_corruption and "
                                         r"data.source=embedded, and this run has "
                                         r"task=translation and data.source=embedded"):
        validate.check(c)
