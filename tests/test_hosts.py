"""Per-host input in one process: batch shards, the streams that fill them, their states
(exact resume on the same shards, a reshaped restart on others), the evaluation split, and the
coordinator wait. The 2-process runs themselves are in test_multiprocess.py."""
import socket

import numpy as np
import pytest

from switchzoo import data, hosts
from switchzoo.commands import cli
from switchzoo import state as state_lib
from switchzoo.data import pipeline
from test_data import assert_same, corpus, files_config, pairs, take  # noqa: F401,F811 (fixtures)

L = 32


def build(corpus, tmp_path, task="lm", batch=8, shards=1, local=None, seed=3, fixed=0):
    """``local``: the input shards this "process" reads (their rows); ``fixed``: a
    data.input_shards setting."""
    per = batch // shards
    rows = None if local is None else (local.start * per, local.stop * per)
    cfg = files_config(corpus, task)
    cfg.input_shards = fixed
    return data.build(cfg, tmp_path, task=task, batch_size=batch, max_length=L, seed=seed,
                      shards=shards, rows=rows)


def test_share_follows_the_layout_and_checks_rows():
    layout = state_lib.make_layout("dp_ep", "data:2,model:1,expert:4")
    share = hosts.share(layout, 16)             # dp_ep: batch over data+expert = 8 shards
    assert (share.shards, share.first, share.count, share.row_range) == (8, 0, 8, (0, 16))
    assert "reads rows 0..15 of each global batch" in share.describe(100)
    data_only = hosts.share(state_lib.make_layout("data_parallel", "data:2,model:2,expert:2"), 6)
    assert (data_only.shards, data_only.rows_per_shard) == (2, 3)
    with pytest.raises(ValueError, match="12 rows does not split into the 8 batch shards"):
        hosts.share(layout, 12)


def test_held_shards_must_be_one_run():
    rows = [(slice(0, 2),), (slice(2, 4),), (slice(2, 4),)]        # shards 0, 1 (1 twice)
    assert hosts.held_shards(rows, 2) == (0, 2)
    with pytest.raises(ValueError, match=r"shards \[0, 2\], not one contiguous run"):
        hosts.held_shards([(slice(0, 2),), (slice(4, 6),)], 2, ("expert", "data"))


def test_the_global_batch_depends_on_the_shards_not_on_who_reads_them(corpus, tmp_path):
    whole = build(corpus, tmp_path, shards=4)
    halves = [build(corpus, tmp_path, shards=4, local=range(a, a + 2)) for a in (0, 2)]
    for _ in range(3):
        global_batch = next(whole.train)
        parts = [next(h.train) for h in halves]
        assert all(p["inputs"].shape[0] == 4 for p in parts)
        joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        assert_same([joined], [global_batch])
        rows = [hosts.shard_digests(p, hosts.Share(0, 2, 4, a, 2, 8))
                for p, a in zip(parts, (0, 2))]
        assert not set(rows[0].values()) & set(rows[1].values())       # disjoint halves
        assert {**rows[0], **rows[1]} == hosts.shard_digests(global_batch,
                                                             hosts.Share(0, 1, 4, 0, 4, 8))
    one = build(corpus, tmp_path, shards=1)          # one shard: the stream as before shards
    assert not np.array_equal(next(one.train)["inputs"], next(whole.train)["inputs"])


def test_each_shard_reads_its_own_stride_of_the_shuffled_stream(corpus, tmp_path):
    texts = data.build(files_config(corpus, "lm"), tmp_path, task="lm", batch_size=2,
                       max_length=L).train.num_examples
    d = build(corpus, tmp_path, batch=2, shards=2, local=range(1, 2))
    order = pipeline.grain.MapDataset.source(list(range(texts))).shuffle(seed=3).repeat(None)
    lines = (corpus / "lm.txt").read_text().splitlines()
    tok = d.tokenizer
    expected = {tuple(tok.encode(lines[order[i]])[:L - 1]) for i in range(1, 400, 2)}
    batch = next(d.train)
    for row, seg in zip(batch["targets"], batch["segments"]):
        for s in range(1, seg.max() + 1):
            ids = tuple(int(x) for x in row[seg == s][:-1])          # drop the EOS
            assert ids in expected


def test_shard_states_resume_on_any_split_and_reshape_restarts(corpus, tmp_path):
    halves = [build(corpus, tmp_path, shards=2, local=range(a, a + 1)) for a in (0, 1)]
    for h in halves:
        take(h.train, 40)
    state = pipeline.merge_states([h.train.get_state() for h in halves])
    assert sorted(state["shards"]) == ["0", "1"]
    expected = [{k: np.concatenate([a[k], b[k]]) for k in a}
                for a, b in zip(take(halves[0].train, 3), take(halves[1].train, 3))]
    whole = build(corpus, tmp_path, shards=2)                    # 2 "processes" -> 1
    whole.train.set_state(state)
    assert not whole.train.reshaped
    assert_same(take(whole.train, 3), expected)
    # another mesh (4 batch shards): the run's 2 input shards go on, exactly
    four = build(corpus, tmp_path, shards=4)
    four.train.set_state(state)
    assert four.train.shards == 2 and not four.train.reshaped
    assert "the run's input is 2 input shards; this mesh's 4 batch shards" in four.train.continued
    assert_same(take(four.train, 3), expected)
    # data.input_shards=4 asks for others: the streams restart where the slowest had got to
    four = build(corpus, tmp_path, shards=4, fixed=4)
    four.train.set_state(state)
    read = [pipeline._source_position(v) for v in state["shards"].values()]
    assert four.train.start == 2 * min(read) > 0
    assert f"restarts at example {2 * min(read):,}" in four.train.reshaped
    fresh = build(corpus, tmp_path, shards=4)
    fresh.train._restart(2 * min(read))
    assert_same(take(four.train, 2), take(fresh.train, 2))
    with pytest.raises(ValueError, match="seed"):
        build(corpus, tmp_path, shards=2, seed=4).train.set_state(state)


def test_processes_holding_parts_of_an_input_shard_read_its_rows(corpus, tmp_path):
    """2 input shards of 4 rows read by 4 "processes" of 2 rows (a mesh of 4 batch shards
    under data.input_shards=2), and by one: the same global batch, every row once."""
    whole = build(corpus, tmp_path, shards=2)
    quarters = [data.build(files_config(corpus, "lm"), tmp_path, task="lm", batch_size=8,
                           max_length=L, seed=3, shards=2, rows=(a, a + 2)).train
                for a in (0, 2, 4, 6)]
    assert [q.local for q in quarters] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    for _ in range(2):
        joined = [next(q) for q in quarters]
        assert all(j["inputs"].shape[0] == 2 for j in joined)
        assert_same([{k: np.concatenate([j[k] for j in joined]) for k in joined[0]}],
                    [next(whole.train)])
    with pytest.raises(ValueError, match="8 rows does not split into 3 input shards; set "
                                         "data.input_shards to a divisor of 8"):
        build(corpus, tmp_path, shards=3)


def test_a_state_from_before_shards_resumes(corpus, tmp_path):
    d = build(corpus, tmp_path)
    take(d.train, 5)
    state = d.train.get_state()
    old = {k: v for k, v in state.items() if k not in ("shards", "num_shards", "start")}
    old["grain"] = state["shards"]["0"]
    expected = take(d.train, 2)
    again = build(corpus, tmp_path)
    again.train.set_state(old)
    assert_same(take(again.train, 2), expected)


@pytest.mark.parametrize("task", ["translation", "lm"])
def test_evaluation_parts_cover_the_set_once(corpus, tmp_path, task):
    d = data.build(files_config(corpus, task), tmp_path, task=task, batch_size=6, max_length=L)
    whole = list(d.eval_batches(shards=3))
    n = d.eval_batch_count(3)
    assert len(whole) == n == 4            # 20 texts: parts of 6, 7, 7; 2 rows per shard
    per_shard = [list(d.eval_batches(3, range(s, s + 1), n)) for s in range(3)]
    for k, batch in enumerate(whole):
        joined = {f: np.concatenate([p[k][f] for p in per_shard]) for f in batch}
        assert_same([joined], [batch])
    targets = sorted(tuple(t[t > 0]) for b in whole for t, w in zip(b["targets"], b["weights"])
                     if w.max() > 0)
    single = sorted(tuple(t[t > 0]) for b in d.eval_batches() for t, w in
                    zip(b["targets"], b["weights"]) if w.max() > 0)
    assert targets == single and len(single) == 20
    assert len(list(d.eval_batches(3, range(1), num_batches=5))) == 5    # padded to agree


def test_coordinator_wait_fails_in_one_line():
    clock = iter(range(0, 100, 2))
    refused = ConnectionRefusedError(111, "Connection refused")

    def connect(address, timeout):
        raise refused
    with pytest.raises(ValueError, match=r"no coordinator answers at 127.0.0.1:9 after 5 s "
                                         r"\(Connection refused\): start process 0"):
        cli.wait_for_coordinator("127.0.0.1:9", 5, connect, lambda: next(clock), lambda s: None)
    with pytest.raises(ValueError, match="HOST:PORT"):
        cli.wait_for_coordinator("localhost", 5)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        cli.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", 5)
