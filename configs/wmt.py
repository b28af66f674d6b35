"""python train.py --config=configs/wmt.py:model=switch_base_8,layout=dp_ep,pair=de-en --workdir=DIR

WMT14 translation (en-de or en-fr, either direction) from the tfds builder
wmt14_translate/<de|fr>-en (prepared in --config.data.tfds_data_dir), or from local TSV files with
--config.data.source=files --config.data.train_files=a.tsv[.gz] --config.data.eval_files=b.tsv.
Variant keys: model, layout, mesh, pair (source-target, e.g. en-de), steps.
"""
from switchzoo.configs import base


def get_config(arg: str | None = None):
    c = base.get_paper_scale()
    c.model = "switch_base_8"
    c.task = "translation"
    c.layout = "dp_ep"
    c.data.pair = "en-de"          # tfds_name "": wmt14_translate/<de|fr>-en, split validation
    base.apply_variant(c, arg, {"steps": "num_train_steps", "pair": "data.pair"})
    return c
