"""Greedy decoding throughput of a catalogue model with the KV cache (jitted scan).

    python bench/decode.py [--model switch_tiny] [--batch 8] [--prompt 16] [--new 64]

Prints one JSON object: machine, config, compile seconds, new tokens per second (best of 3).
"""
import argparse
import json
import platform
import time

import jax
import numpy as np

import switchzoo


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="switch_tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=64)
    args = p.parse_args()
    model = switchzoo.init(args.model)
    prompt = np.random.default_rng(0).integers(2, model.cfg.vocab_size, (args.batch, args.prompt))
    start = time.perf_counter()
    model.generate(prompt, max_new_tokens=args.new)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model.generate(prompt, max_new_tokens=args.new)
        times.append(time.perf_counter() - start)
    print(json.dumps({
        "machine": f"{platform.machine()} {jax.devices()[0].device_kind} x{jax.device_count()}",
        "model": args.model, "batch": args.batch, "prompt": args.prompt, "new_tokens": args.new,
        "compile_plus_first_s": round(compile_s, 2), "best_s": round(min(times), 4),
        "tokens_per_s": round(args.batch * args.new / min(times), 1)}))


if __name__ == "__main__":
    main()
