"""Read-ahead (data.prefetch): the streams in threads and the next batch placed on the devices
change nothing a run reads: the same batches, hashes and states as without, an exact resume
from a checkpoint taken with batches in flight, and a stream's error raised as it was."""
import time

import jax
import numpy as np
import pytest

from switchzoo import data, hosts
from switchzoo.data import embedded, feed, files, pipeline

B, L, SHARDS = 4, 32, 2
SHARE = hosts.Share(process=0, processes=1, shards=SHARDS, first=0, count=SHARDS, rows=B)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Real short English-German pairs of the shipped corpus, as TSV files."""
    pairs = [p for p in embedded.shipped("de") if len(p[0]) < 60 and p[0].isascii()][::7][:600]
    root = tmp_path_factory.mktemp("corpus")
    files.write_tsv(root / "train.tsv", pairs[:-20])
    files.write_tsv(root / "eval.tsv", pairs[-20:])
    return root


def config(corpus, prefetch):
    cfg = data.default_config()
    cfg.update(source="files", train_files=str(corpus / "train.tsv"),
               eval_files=str(corpus / "eval.tsv"), vocab_size=300, prefetch=prefetch)
    return cfg


def build(corpus, workdir, prefetch, task="translation"):
    return data.build(config(corpus, prefetch), workdir, task=task, batch_size=B, max_length=L,
                      seed=5, shards=SHARDS).train


def run(train, n, ahead=0):
    """n (batch, fingerprint, state after it) through a Feed placing ``ahead`` batches early."""
    f = feed.Feed(train, lambda b: jax.device_put(b), ahead)
    out = []
    for _ in range(n):
        batch, placed = next(f)
        assert all(np.array_equal(np.asarray(placed[k]), batch[k]) for k in batch)
        out.append((batch, hosts.batch_fingerprint(batch, SHARE)["batch_sha1"], f.get_state()))
    return out, f


def assert_same(a, b):
    assert len(a) == len(b)
    for (batch_a, sha_a, state_a), (batch_b, sha_b, state_b) in zip(a, b):
        assert batch_a.keys() == batch_b.keys() and sha_a == sha_b and state_a == state_b
        for k in batch_a:
            np.testing.assert_array_equal(batch_a[k], batch_b[k], err_msg=k)


def wait_full(train):
    """Until every shard's thread has read as far ahead as it may."""
    deadline = time.time() + 20
    while not all(it._buffer.full() for it in train._iterators.values()):
        assert time.time() < deadline, "the read-ahead threads did not fill their buffers"
        time.sleep(0.01)


@pytest.mark.parametrize("task", ["translation", "span_corruption"])
def test_read_ahead_gives_the_batches_hashes_and_states_of_none(corpus, tmp_path, task):
    plain = build(corpus, tmp_path, 0, task)
    ahead = build(corpus, tmp_path, 3, task)
    reference, _ = run(plain, 12)
    assert_same(run(ahead, 12, ahead=1)[0], reference)
    threads = [it._prefetch_thread for it in ahead._iterators.values()]
    assert all(t is not None and t.is_alive() for t in threads)
    ahead.close()                           # the threads stop: nothing is left reading
    assert not any(t.is_alive() for t in threads)
    plain.close()


def test_a_checkpoint_with_batches_in_flight_resumes_to_the_uninterrupted_batches(corpus,
                                                                                   tmp_path):
    straight, _ = run(build(corpus, tmp_path, 2), 10, ahead=1)
    cut = build(corpus, tmp_path, 2)
    first, f = run(cut, 4, ahead=1)          # batch 5 placed, 6 and 7 queued, 8 being packed
    wait_full(cut)
    state = f.get_state()                    # what a checkpoint of step 4 saves
    assert state == straight[3][2] and first[-1][1] == straight[3][1]
    cut.close()
    for prefetch in (2, 0):                  # the state resumes with read-ahead on or off
        resumed = build(corpus, tmp_path, prefetch)
        resumed.set_state(state)
        if prefetch:
            for it in resumed._iterators.values():
                it.start_prefetch()
            wait_full(resumed)               # reading ahead leaves the restored state alone
        assert resumed.get_state() == state
        assert_same(run(resumed, 6, ahead=1)[0], straight[4:])
        resumed.close()


def test_a_stream_error_is_raised_in_the_training_thread_as_it_was(corpus, tmp_path):
    tokenizer = data.build(config(corpus, 0), tmp_path, batch_size=B, max_length=L).tokenizer
    good = pipeline.featurizer(tokenizer, "translation", L)
    seen = []

    def featurize(example):
        seen.append(example)
        if len(seen) == 30:
            raise ValueError("example 30 is not a pair: give source<TAB>target lines")
        return good(example)

    examples = [tuple(line.split("\t")) for line in
                (corpus / "train.tsv").read_text().splitlines()]
    errors = []
    for prefetch in (0, 2):
        seen.clear()
        train = pipeline.train_iterator(examples, featurize, "translation", B, L, seed=1,
                                        prefetch=prefetch)
        f = feed.Feed(train, lambda b: b, ahead=1 if prefetch else 0)
        start = time.time()
        with pytest.raises(ValueError) as raised:
            for _ in range(100):
                next(f)
        assert time.time() - start < 20          # raised, not hung
        errors.append(str(raised.value))
        train.close()
    assert errors[0] == errors[1] == "example 30 is not a pair: give source<TAB>target lines"
