"""Switch Transformer (Fedus, Zoph, Shazeer; arXiv 2101.03961) Table 5: fine-tuning FLOP-matched
pairs on downstream tasks, validation sets, the peak score of each fine-tune.

    python eval.py --table=switch_table5 --runs=runs/ft_glue_t5_base,runs/ft_glue_switch_base,...

Ours: each fine-tune (train.py --config=configs/finetune.py:task=...,model=...) scored by eval.py
at its best checkpoint (results.json task_score: the task's reported metric, a benchmark's
average over its members).
"""

_PAPER = "Switch paper (arXiv 2101.03961v3, JMLR 2022) Table 5"
_COMMAND = ("python train.py --config=configs/finetune.py:task=glue,model=switch_base_128,"
            "init_from=HF_DIR --workdir=runs/ft_glue_switch_base && python eval.py "
            "--workdir=runs/ft_glue_switch_base")


def _rows():
    # task label, finetune.task (None: not in the registry), T5-Base, Switch-Base, T5-Large,
    # Switch-Large
    table = [("GLUE", "glue", 84.3, 86.7, 87.8, 88.5),
             ("SQuAD", "squad_v1", 85.5, 87.2, 88.1, 88.6),
             ("SuperGLUE", "super_glue", 75.1, 79.5, 82.7, 84.7),
             ("Winogrande (XL)", None, 66.6, 73.3, 79.1, 83.0),
             ("XSum", "xsum", 18.7, 20.3, 20.9, 22.3),
             ("ANLI (R3)", None, 51.8, 54.0, 56.6, 58.6),
             ("ARC Easy", None, 56.7, 61.3, 68.8, 66.0),
             ("ARC Challenge", None, 35.5, 32.8, 35.5, 35.5),
             ("CB Web QA", None, 26.6, 27.4, 27.7, 31.3),
             ("CB Natural QA", None, 25.8, 26.8, 27.6, 29.5),
             ("CB Trivia QA", None, 24.5, 30.7, 29.5, 36.9)]
    models = [("T5-Base", "t5_base"), ("Switch-Base", "switch_base_128"),
              ("T5-Large", "t5_large"), ("Switch-Large", "switch_large_128")]
    rows = []
    for label, task, *published in table:
        for (name, model), value in zip(models, published):
            rows.append(dict(label=f"{label}, {name}",
                             match=None if task is None else {"finetune.task": task,
                                                              "model": model},
                             published=dict(task_score=value)))
    return rows


TABLE = dict(
    title="Switch Transformer Table 5: fine-tuning FLOP-matched pairs (validation, peak)",
    source=(f"{_PAPER}. Pre-trained 550k steps at 2^20 tokens a batch, fine-tuned 16k steps at "
            "1M tokens a batch, evaluated every 200 steps, the peak reported; dropout 0.1, "
            "expert dropout 0.4. GLUE and SuperGLUE: averages over their tasks; SQuAD exact "
            "match; XSum ROUGE-2. Winogrande, ANLI, ARC and closed-book QA have no task in the "
            "registry (match None)."),
    metric="task_score",
    columns=[("task_score", "paper")],
    ours=[("task_score", "ours")],
    rows=_rows(),
    command=_COMMAND,
)
