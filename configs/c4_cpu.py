"""python train.py --config=configs/c4_cpu.py:model=switch_cpu_8,cf=1.25 --workdir=DIR

configs/c4.py's span-corruption recipe scaled to one CPU, for experiments/switch_vs_dense.py
and experiments/routing_family.py: the CPU-sized t5_cpu / switch_cpu_{8,16,32} (d_model 128, 4+4
layers), inputs 128 and targets 29, 8 sequences per step, 3,000 steps with the rsqrt schedule's
k at 300 (T5's shape; T5's own k, configs/c4.py's, is 10,000),
evaluated every 250 on up to 1,000 held-out documents. Text: the English side of the embedded
corpus by default; real prose with --config.data.source=files --config.data.train_files=docs.txt
(python experiments/english_text.py --out docs.txt: gettext messages and the GNU manuals).
Variant keys: as configs/c4.py (model, cf, top_k, steps, layout, mesh).
"""
from switchzoo.configs import base, c4


def get_config(arg: str | None = None):
    c = c4.get_config()
    c.model = "t5_cpu"
    c.layout, c.mesh = "data_parallel", ""
    c.max_length, c.per_device_batch_size = 128, 8
    c.num_train_steps, c.warmup_steps = 3000, 300
    c.eval_every_steps, c.checkpoint_every_steps, c.log_every_steps = 250, 1000, 50
    c.data.source, c.data.vocab_size, c.data.max_eval_examples = "embedded", 4000, 1000
    base.apply_variant(c, arg, c4.VARIANTS)
    return c
