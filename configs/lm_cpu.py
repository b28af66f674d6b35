"""python train.py --config=configs/lm_cpu.py:model=switch_lm_cpu_8 --workdir=DIR
    --config.data.train_files=CORPUS/train.txt --config.data.eval_files=CORPUS/eval.txt

The Switch paper's recipe (configs/c4.py: Adafactor, per expert, with the inverse-square-root
schedule in T5's shape, 0.01 x sqrt(k / max(step, k)); weights from a truncated normal of std
sqrt(0.1 / fan-in); no dropout; load-balancing loss 0.01 per Switch layer; top-1 at capacity
1.25, evaluated at 2.0)
on a decoder-only language model (every token supervised: the LM1B path) sized for one CPU, in
the regime where a dense model is limited by its parameters: the claims study
(experiments/lm_claims.py) trains dense_lm_cpu (443k non-embedding parameters) on ~20 tokens
per parameter of English prose (python -m switchzoo.data.english --out CORPUS). 32 sequences
of 128 tokens per step (4,096 tokens), vocabulary 4,000 SentencePiece pieces.
Variant keys: model, steps, cf (train capacity factor), top_k, seed.

The schedule's k (warmup_steps) is 400 here and 250 in the claims studies (their --warmup), so
the rate decays from step 250: 0.0032 by step 2,400, a third of its peak. T5's own constants
are k = 10,000 at 0.01 (1/sqrt(max(step, 10^4)), configs/c4.py), which holds 0.01 for any CPU
budget: --config.warmup_steps=10000 (the studies: --warmup 10000).
"""
from switchzoo.configs import base

VARIANTS = {"steps": "num_train_steps", "cf": "moe.train_capacity_factor", "top_k": "moe.top_k"}


def get_config(arg: str | None = None):
    c = base.get_base()
    c.model = "dense_lm_cpu"
    c.task = "lm"
    c.layout, c.mesh = "data_parallel", ""
    c.max_length, c.per_device_batch_size = 128, 32   # one CPU device: 32 sequences
    c.num_train_steps, c.warmup_steps = 4000, 400
    c.optimizer, c.learning_rate, c.schedule = "adafactor", 0.01, "rsqrt"
    c.init_scale, c.init_distribution = 0.1, "truncated_normal"
    c.dropout = 0.0
    c.eval_every_steps, c.checkpoint_every_steps, c.log_every_steps = 500, 500, 100
    c.data.source, c.data.vocab_size, c.data.max_eval_examples = "files", 4000, 2000
    base.apply_variant(c, arg, VARIANTS)
    return c
