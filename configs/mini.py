"""python train.py --config=configs/mini.py:model=switch_tiny --workdir=runs/mini_switch_tiny

Minutes-long CPU runs of the tiny catalogue models: a language model on the English side of the
embedded corpus, every model trained with the same data, steps and batch, so validation losses
compare at equal steps. The tiny models are in no table: a mini table's rows (python -m
switchzoo.tables --list) are runs of configs/lm_cpu.py (the LM tables: model=dense_lm_cpu,
switch_lm_cpu_8, ...) or configs/demo.py (mtf_table3_wmt_mini), and `python eval.py
--table=NAME` without --runs prints the command that trains them. For example:

    for m in switch_tiny dense_tiny; do
      python train.py --config=configs/mini.py:model=$m --workdir=runs/mini_$m &&
      python eval.py --workdir=runs/mini_$m; done

Variant keys: model, steps, task (lm; translation needs encoder-decoders such as switch_base_tiny
and t5_tiny), and any config field (e.g. moe.train_capacity_factor=1.0).
"""
from switchzoo.configs import base


def get_config(arg: str | None = None):
    c = base.get_base()
    c.model = "switch_tiny"
    c.task = "lm"
    c.layout = "data_parallel"
    c.num_train_steps = 3000
    c.log_every_steps = 50
    c.eval_every_steps = 1000
    c.checkpoint_every_steps = 1000
    c.per_device_batch_size = 16
    c.max_length = 64
    c.optimizer = "adamw"
    c.learning_rate = 3e-3
    c.schedule = "linear_rsqrt"           # AdamW wants a warm-up ramp (not the paper's recipe)
    c.warmup_steps = 100
    c.dropout = 0.0
    c.data.source = "embedded"
    c.data.pair = "de-en"                 # the LM reads the target side: English
    c.data.vocab_size = 2000
    base.apply_variant(c, arg, {"steps": "num_train_steps"})
    return c
