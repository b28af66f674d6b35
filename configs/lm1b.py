"""python train.py --config=configs/lm1b.py:model=mtf_lm1b_h8 --workdir=DIR

Language modelling on LM1B from the tfds builder lm1b (prepared in --config.data.tfds_data_dir),
or from local text files (one text per line) with --config.data.source=files
--config.data.train_files=a.txt[.gz] --config.data.eval_files=b.txt. Reports token and word
perplexity. Variant keys: model, layout, mesh, steps.
"""
from configs import base


def get_config(arg: str | None = None):
    c = base.get_base()
    c.model = "mtf_lm1b_h8"
    c.task = "lm"
    c.layout = "dp_mp_ep"
    c.num_train_steps = 100_000
    c.per_device_batch_size = 16
    c.max_length = 256
    c.warmup_steps = 10_000
    c.eval_every_steps = 5000
    c.checkpoint_every_steps = 2000
    c.data.source = "tfds"
    c.data.tfds_name = "lm1b"
    c.data.eval_split = "test"
    c.data.vocab_size = 32000
    base.apply_variant(c, arg, {"steps": "num_train_steps"})
    return c
