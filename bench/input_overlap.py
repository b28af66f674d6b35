"""Input off the critical path, for the demo config (configs/demo.py): the steps/s of train.py's
own loop (switchzoo.loop.train) reading the real input / its steps/s when every step reads one
synthetic batch again (the first real batch, so the same shapes and token count), with
read-ahead off (data.prefetch=0: tokenizing and packing in the training thread, numpy handed
to the step: the loop before) and on (data.prefetch=2: the streams in threads, the next batch
placed on the devices during the step). Goal: >= 0.95 with read-ahead.

Each run is a fresh workdir (the corpus and tokenizer copied in) training --steps steps with
a log row every --log-every (the loop blocks there on the step's metrics, as it does in a
run), no evaluation and one checkpoint at the end; its steps/s is the best interval between
log rows, as the loop's own tokens-per-second timer measures them (compile excluded). The four
runs alternate, --rounds times, so that all see the same load on a shared machine. Also the
training thread's own CPU time per step spent getting its input (the median; with read-ahead,
a queue hand-over and the next batch's placement), load-independent where the ratio is not:
the input the step waits behind when dispatch cannot run ahead (a GPU step of a few ms).

    python bench/input_overlap.py [--steps 100] [--rounds 2] [--model M] [--quick] [--out F]
"""
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from common import emit, machine, parser


class Reused:
    """A train iterator that hands on its first batch at every step (the synthetic input)."""

    def __init__(self, train):
        self.train, self.batch = train, None

    def __iter__(self):
        return self

    def __next__(self):
        if self.batch is None:
            self.batch = next(self.train)
        return self.batch

    def __getattr__(self, name):        # state, reshaped, num_examples, close: the real one's
        return getattr(self.train, name)


def main():
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=100, help="train steps per run")
    p.add_argument("--log-every", type=int, default=50, help="the demo's log_every_steps")
    p.add_argument("--rounds", type=int, default=2, help="times each of the four runs runs")
    p.add_argument("--prefetch", type=int, default=2, help="data.prefetch of the 'on' runs")
    p.add_argument("--max-pairs", type=int, default=0,
                   help="use only this many corpus pairs (0: all, as the demo does)")
    p.add_argument("--model", default="",
                   help="another catalogue model (a smaller step makes the input a larger share)")
    p.add_argument("--quick", action="store_true",
                   help="small: switch_base_tiny, 30 steps, a row every 10, 4000 pairs, one round")
    args = p.parse_args()
    if args.quick:
        args.steps, args.log_every, args.max_pairs, args.rounds = 30, 10, 4000, 1
        args.model = args.model or "switch_base_tiny"
    import jax

    from switchzoo import data, loop
    from switchzoo import metrics as metrics_lib
    from switchzoo import state as state_lib
    from switchzoo.configs import demo
    from switchzoo.data import feed as feed_lib

    intervals = []                      # (steps, seconds) of each log row of the current run

    class Timed(metrics_lib.Throughput):
        def rate(self):
            intervals.append((self.steps, self.clock() - self.start))
            return super().rate()

    waits = []                          # CPU seconds of the training thread in next(feed)

    class TimedFeed(feed_lib.Feed):
        def __next__(self):
            start = time.thread_time()
            out = super().__next__()
            waits.append(time.thread_time() - start)
            return out

    real_build, real_throughput, real_feed = data.build, metrics_lib.Throughput, feed_lib.Feed

    def synthetic_build(*a, **k):
        d = real_build(*a, **k)
        d.train = Reused(d.train)
        return d

    def config(prefetch):
        c = demo.get_config(f"steps={args.steps}" + (f",model={args.model}" if args.model else ""))
        c.log_every_steps, c.eval_every_steps = args.log_every, 0
        c.checkpoint_every_steps = args.steps          # the final one only
        c.data.prefetch, c.data.embedded_max_pairs = prefetch, args.max_pairs
        return c

    runs = {(input_, prefetch): [] for input_ in ("real", "synthetic")
            for prefetch in (0, args.prefetch)}
    input_ms = {prefetch: [] for prefetch in (0, args.prefetch)}    # real input, per step
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jax.config.update("jax_compilation_cache_dir", str(tmp / "jax-cache"))  # compile once
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        base = config(0)
        start = time.perf_counter()
        ds = real_build(base.data, tmp / "base", task=base.task,
                        batch_size=state_lib.global_batch_size(base), max_length=base.max_length,
                        seed=base.seed)            # the corpus and tokenizer every run copies
        ds.train.close()
        setup_s = time.perf_counter() - start
        metrics_lib.Throughput, feed_lib.Feed = Timed, TimedFeed
        try:
            for r in range(args.rounds):
                for (input_, prefetch), rates in runs.items():
                    workdir = tmp / f"{input_}-{prefetch}-{r}"
                    shutil.copytree(tmp / "base", workdir)
                    data.build = synthetic_build if input_ == "synthetic" else real_build
                    intervals.clear()
                    waits.clear()
                    loop.train(config(prefetch), workdir, print_fn=lambda *_: None)
                    rates += [n / s for n, s in intervals if n]
                    if input_ == "real":        # the first two: the threads start, compile
                        input_ms[prefetch] += [1e3 * w for w in waits[2:]]
                    shutil.rmtree(workdir)
        finally:
            data.build, metrics_lib.Throughput, feed_lib.Feed = (real_build, real_throughput,
                                                                 real_feed)
    best = {k: max(v) for k, v in runs.items()}
    before = best[("real", 0)] / best[("synthetic", 0)]
    after = best[("real", args.prefetch)] / best[("synthetic", args.prefetch)]
    emit({
        "bench": "input_overlap", "machine": machine(),
        "config": {"config": "configs/demo.py", "model": base.model,
                   "batch": state_lib.global_batch_size(base), "length": base.max_length,
                   "steps": args.steps, "log_every_steps": args.log_every,
                   "rounds": args.rounds, "corpus_pairs": args.max_pairs or "all",
                   "prefetch_on": args.prefetch, "setup_s (corpus + SentencePiece)":
                   round(setup_s, 1)},
        "steps_per_s": {f"{input_}_input_prefetch_{prefetch}": round(v, 3)
                        for (input_, prefetch), v in best.items()},
        "training_thread_input_cpu_ms_per_step (median, real input)": {
            f"prefetch {k}": round(float(np.median(v)), 2) for k, v in input_ms.items()},
        "real_over_synthetic": {"before (prefetch 0)": round(before, 3),
                                f"after (prefetch {args.prefetch})": round(after, 3)},
        "goals": {"real_over_synthetic_with_read_ahead": {
            "value": round(after, 3), "goal": ">= 0.95", "met": after >= 0.95}},
    }, args.out)


if __name__ == "__main__":
    main()
