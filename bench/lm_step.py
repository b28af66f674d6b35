"""The LM claims study's steps on this CPU: Switch-8's train step ÷ its FLOP-matched dense
model's (configs/lm_cpu.py: switch_lm_cpu_8 / dense_lm_cpu, 32 sequences of 128 tokens,
float32, Adafactor, one device), per dispatch. In experiments/lm_claims.py Switch-8 reaches
dense's final loss in ~0.78 of dense's steps; this ratio says whether that lead survives in
wall-clock time.

    python bench/lm_step.py [--repeats 5] [--out F]

Goal (issue 32): <= 1.05 with the default dispatch (with the one-hot einsum: ~1.2).
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402

from common import Step, emit, interleaved_best, machine, parser  # noqa: E402

VOCAB = 4100          # lm_cpu.py's 4,000 pieces + T5's 100 sentinel ids


def main():
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (best of)")
    p.add_argument("--loss-chunk", type=int, default=8192,
                   help="the run's loss_chunk (configs/base.py); 0: full logits")
    args = p.parse_args()

    import jax

    from switchzoo import zoo
    dense = zoo.get("dense_lm_cpu").replace(vocab_size=VOCAB)
    switch = zoo.get("switch_lm_cpu_8").replace(vocab_size=VOCAB)

    def dispatch(name):
        return switch.replace(moe=dataclasses.replace(switch.moe, dispatch=name))
    cases = {"dense": dense, "switch_8_index": dispatch("index"),
             "switch_8_einsum": dispatch("einsum")}
    one = jax.devices()[:1]
    steps = {name: Step(cfg, "data:1", "data_parallel", args.batch, args.length, one,
                        optimizer="adafactor", loss_chunk=args.loss_chunk)
             for name, cfg in cases.items()}
    for s in steps.values():
        s.run(2)                                               # warm up
    best = dict(zip(steps, interleaved_best([s.run for s in steps.values()], args.repeats, 0)))
    results = {name: {"step_s": round(best[name], 5),
                      "tokens_per_s": round(steps[name].tokens() / best[name], 1),
                      "compile_s": round(steps[name].compile_s, 2),
                      "flops_cost_analysis": steps[name].cost_flops(),
                      "flops_hand": 3 * zoo.flops_per_token(cases[name], args.length)
                      * steps[name].tokens()} for name in cases}
    ratios = {k: round(results[k]["step_s"] / results["dense"]["step_s"], 3)
              for k in ("switch_8_index", "switch_8_einsum")}
    emit({"bench": "lm_step", "machine": machine(),
          "config": {"models": ["dense_lm_cpu", "switch_lm_cpu_8"], "vocab": VOCAB,
                     "batch": args.batch, "length": args.length, "dtype": "float32",
                     "optimizer": "adafactor", "loss_chunk": args.loss_chunk, "devices": 1},
          "cases": results, "switch_over_dense_step": ratios,
          "goals": {"switch_8_index_over_dense": {
              "value": ratios["switch_8_index"], "goal": "<= 1.05",
              "met": ratios["switch_8_index"] <= 1.05}}}, args.out)


if __name__ == "__main__":
    main()
