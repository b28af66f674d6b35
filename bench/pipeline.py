"""Input pipeline vs the train step, for the demo config (configs/demo.py), in one run:
batches/s the Grain pipeline delivers (tokenize, pack, batch; one process, as train.py runs it)
/ batches/s the demo's train step consumes on the demo's mesh (1 device). Goal >= 5.

Then one host of a pod of H hosts (H = 32, 256, 2048; each host's devices consume what this
host's do, the demo batch): its input rate at its own share (the streams of its batch shards
only: switchzoo.hosts) / its devices' consumption, measured at each H; and the same ratio
before per-host input, when every host read and packed the whole global batch: the whole-batch
rate (measured at H = 1) / (H x the consumption). Goal: >= 5 at 256 hosts.

    python bench/pipeline.py [--seconds 20] [--host-seconds 5] [--out F]
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import tempfile  # noqa: E402
import time  # noqa: E402

from common import Step, emit, machine, parser  # noqa: E402


def main():
    p = parser(__doc__)
    p.add_argument("--seconds", type=float, default=20.0, help="how long to pull batches")
    p.add_argument("--host-seconds", type=float, default=5.0,
                   help="how long to pull one host's share at each pod size")
    p.add_argument("--hosts", default="1,32,256,2048", help="pod sizes (hosts) to emulate")
    p.add_argument("--max-pairs", type=int, default=0,
                   help="use only this many corpus pairs (0: all, as the demo does)")
    args = p.parse_args()
    import jax

    from switchzoo import data
    from switchzoo import state as state_lib
    from switchzoo.configs import demo
    config = demo.get_config()
    config.data.embedded_max_pairs = args.max_pairs
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        ds = data.build(config.data, workdir, task=config.task,
                        batch_size=state_lib.global_batch_size(config), max_length=config.max_length,
                        seed=config.seed)
        setup_s = time.perf_counter() - start
        next(ds.train)                                   # first batch: workers start
        batches, tokens, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            batch = next(ds.train)
            batches += 1
            tokens += int(batch["targets_segments"].astype(bool).sum()
                          if "targets_segments" in batch else batch["weights"].sum())
        pipe_s = time.perf_counter() - start
        shapes = {k: list(v.shape) for k, v in batch.items()}
        vocab = ds.tokenizer.vocab_size
        rows = shapes["targets"][0]
        share_rates = {h: share_rate(config, workdir, rows, h, args.host_seconds)
                       for h in map(int, args.hosts.split(","))}
    cfg = state_lib.run_model_config(config, vocab)
    bsz, length = shapes["targets"]
    step = Step(cfg, "data:1", config.layout, bsz, length, jax.devices()[:1],
                optimizer=config.optimizer, host_batch=batch)     # a real packed batch
    step_s = step.time(5)
    pipe_rate, step_rate = batches / pipe_s, 1.0 / step_s
    ratio = round(pipe_rate / step_rate, 2)
    consumed = tokens / batches * step_rate               # target tokens/s of one host's step
    whole = tokens / pipe_s
    pod = {str(h): {"share_tokens_per_s": round(r, 1),
                    "after_share_over_consumption": round(r / consumed, 2),
                    "before_whole_over_h_x_consumption": round(whole / (h * consumed), 4)}
           for h, r in share_rates.items()}
    at_256 = pod.get("256", {}).get("after_share_over_consumption")
    emit({
        "bench": "pipeline", "machine": machine(),
        "config": {"config": "configs/demo.py", "model": config.model, "batch": bsz,
                   "length": length, "corpus_pairs": args.max_pairs or "all",
                   "vocab": vocab, "batch_fields": shapes},
        "pipeline": {"setup_s (corpus + SentencePiece)": round(setup_s, 1),
                     "batches_per_s": round(pipe_rate, 2),
                     "target_tokens_per_s": round(tokens / pipe_s, 1)},
        "train_step": {"step_s": round(step_s, 4), "batches_per_s": round(step_rate, 2),
                       "compile_s": round(step.compile_s, 2)},
        "pod_hosts": {"consumed_target_tokens_per_s": round(consumed, 1), "hosts": pod},
        "goals": {"pipeline_over_train_step": {"value": ratio, "goal": ">= 5",
                                                "met": ratio >= 5},
                  "pipeline_share_over_consumption_256_hosts": {
                      "value": at_256, "goal": ">= 5", "met": at_256 is not None and at_256 >= 5}},
    }, args.out)


def share_rate(config, workdir, rows: int, hosts: int, seconds: float) -> float:
    """Target tokens/s of host 0's own rows when ``hosts`` hosts of ``rows`` rows each (one
    batch shard per host) read a global batch: the streams of its shard only."""
    from switchzoo import data
    ds = data.build(config.data, workdir, task=config.task, batch_size=rows * hosts,
                    max_length=config.max_length, seed=config.seed, shards=hosts,
                    rows=(0, rows))
    next(ds.train)
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += int(next(ds.train)["weights"].sum())
    return tokens / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
