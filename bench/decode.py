"""Greedy decoding throughput of catalogue models with the KV cache (one jitted scan), on one
device: a decoder-only and an encoder-decoder model, batch 1 and batch 8.

    python bench/decode.py [--models switch_tiny,switch_base_tiny] [--prompt 16] [--new 64]

Prints one JSON object: machine, config, compile seconds, new tokens per second (best of 3).
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402

from common import best_of, emit, machine, parser  # noqa: E402


def main():
    p = parser(__doc__)
    p.add_argument("--models", default="switch_tiny,switch_base_tiny")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=64)
    args = p.parse_args()
    import numpy as np

    import switchzoo
    cases = []
    for name in args.models.split(","):
        model = switchzoo.init(name)
        for batch in map(int, args.batches.split(",")):
            prompt = np.random.default_rng(0).integers(2, model.cfg.vocab_size,
                                                       (batch, args.prompt))
            start = time.perf_counter()
            model.generate(prompt, max_new_tokens=args.new)
            compile_s = time.perf_counter() - start
            best = best_of(lambda: model.generate(prompt, max_new_tokens=args.new), 3, 0)
            cases.append({"model": name, "batch": batch, "compile_plus_first_s": round(compile_s, 2),
                          "best_s": round(best, 4),
                          "tokens_per_s": round(batch * args.new / best, 1)})
    emit({"bench": "decode", "machine": machine(),
          "config": {"prompt": args.prompt, "new_tokens": args.new, "greedy": True,
                     "kv_cache": True}, "cases": cases}, args.out)


if __name__ == "__main__":
    main()
