"""python train.py --config=configs/demo.py --workdir=/tmp/switchzoo_demo

A short training of switch_tiny (8 experts in every other layer, byte-level) on the CPython
licence text: the loss falls from ~4.3 at step 25 to ~1.6 at step 300, in ~30 s on a 2-core CPU.
"""
import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = "switch_tiny"
    c.layout = "data_parallel"        # a preset in layouts/ or a layout string
    c.mesh = ""                       # empty: the preset's mesh
    c.seed = 0
    c.num_train_steps = 300
    c.log_every_steps = 25
    c.per_device_batch_size = 16
    c.max_length = 128
    c.optimizer = "adamw"
    c.learning_rate = 3e-3
    c.warmup_steps = 50
    if arg:
        for item in arg.split(","):
            key, _, value = item.partition("=")
            if key not in c:
                raise ValueError(f"configs/demo.py: unknown variant key '{key}'; keys: {list(c)}")
            c[key] = type(c[key])(value)
    return c
