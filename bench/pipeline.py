"""Input pipeline vs the train step, for the demo config (configs/demo.py), in one run:
batches/s the Grain pipeline delivers (tokenize, pack, batch; one process, as train.py runs it)
/ batches/s the demo's train step consumes on the demo's mesh (1 device). Goal >= 5.

    python bench/pipeline.py [--seconds 20] [--out F]
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import tempfile  # noqa: E402
import time  # noqa: E402

from common import Step, emit, machine, parser  # noqa: E402


def main():
    p = parser(__doc__)
    p.add_argument("--seconds", type=float, default=20.0, help="how long to pull batches")
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
    cfg = state_lib.run_model_config(config, vocab)
    bsz, length = shapes["targets"]
    step = Step(cfg, "data:1", config.layout, bsz, length, jax.devices()[:1],
                optimizer=config.optimizer, host_batch=batch)     # a real packed batch
    step_s = step.time(5)
    pipe_rate, step_rate = batches / pipe_s, 1.0 / step_s
    ratio = round(pipe_rate / step_rate, 2)
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
        "goals": {"pipeline_over_train_step": {"value": ratio, "goal": ">= 5",
                                                "met": ratio >= 5}},
    }, args.out)


if __name__ == "__main__":
    main()
