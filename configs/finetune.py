"""python train.py --config=configs/finetune.py:task=movie_reviews,init_from=RUN_OR_HF_DIR --workdir=DIR

Fine-tune a pre-trained model on a downstream task, scored by the task's metric.

    python -m switchzoo.tasks.movie_reviews --out ~/switchzoo_data/movie_reviews   # once
    python eval.py --workdir=DIR [--config.finetune.eval_split=test]

The Switch paper's fine-tuning recipe (sec. 3 and Table 4, as T5X runs it): Adafactor at a
constant 1e-3, dropout 0.1, expert dropout 0.4, evaluation capacity factor 2.0, the task scored
on its validation split every eval_every_steps and the best checkpoint kept by that score
(workdir/best/; the paper reports each fine-tune's peak). Each example is routed on its own at
evaluation (moe.eval_groups=sequence), so its prediction does not depend on its batch.

Variant keys: task (python -m switchzoo.tasks lists them; "files" for your own:
--config.finetune.train_files/eval_files/inputs/targets/labels/metrics), model, init_from,
layout, mesh, steps. Without init_from the model starts from scratch (a catalogue name).
"""
from switchzoo.configs import base


def get_config(arg: str | None = None):
    c = base.get_base()
    c.task = "text2text"
    c.model = "switch_base_8"
    c.layout = "data_parallel"
    c.num_train_steps = 2000
    c.log_every_steps = 50
    c.eval_every_steps = 200
    c.checkpoint_every_steps = 200
    c.keep_checkpoints = 1              # the best checkpoint is kept apart (workdir/best/)
    c.per_device_batch_size = 32
    c.max_length = 128
    c.optimizer = "adafactor"
    c.learning_rate = 1e-3
    c.schedule = "constant"
    c.dropout = 0.1
    # expert dropout 0.4: finetune.expert_dropout, applied to a model with Switch layers; the
    # evaluation capacity factor is the model's (2.0 in the catalogue's Switch models)
    c.data.max_eval_examples = 0        # score the whole split
    c.finetune.task = "movie_reviews"
    c.finetune.target_length = 32       # targets rows (labels are a few tokens; packed)
    base.apply_variant(c, arg, {"task": "finetune.task", "steps": "num_train_steps"})
    return c
