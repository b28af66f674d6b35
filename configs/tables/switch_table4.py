"""Switch Transformer (Fedus, Zoph, Shazeer; arXiv 2101.03961) Table 4: fine-tuning with more
dropout, and with expert dropout (a higher rate inside the experts only), Switch-Base against
T5-Base on GLUE, CNNDM, SQuAD and SuperGLUE.

    python eval.py --table=switch_table4 --runs=runs/ft_glue_d0.1,runs/ft_glue_ed0.4,...

Ours: fine-tunes of configs/finetune.py (dropout: --config.dropout; expert dropout:
--config.finetune.expert_dropout) scored by eval.py at their best checkpoint (task_score).
"""

_PAPER = "Switch paper (arXiv 2101.03961v3, JMLR 2022) Table 4"
_TASKS = [("GLUE", "glue"), ("CNNDM", "cnn_dailymail"), ("SQuAD", "squad_v1"),
          ("SuperGLUE", "super_glue")]
# model label, catalogue model, dropout, expert dropout (None: a dense model), GLUE, CNNDM,
# SQuAD, SuperGLUE
_PUBLISHED = [("T5-Base (d=0.1)", "t5_base", 0.1, None, 82.9, 19.6, 83.5, 72.4),
              ("Switch-Base (d=0.1)", "switch_base_128", 0.1, 0.1, 84.7, 19.1, 83.7, 73.0),
              ("Switch-Base (d=0.2)", "switch_base_128", 0.2, 0.2, 84.4, 19.2, 83.9, 73.2),
              ("Switch-Base (d=0.3)", "switch_base_128", 0.3, 0.3, 83.9, 19.6, 83.4, 70.7),
              ("Switch-Base (d=0.1, ed=0.4)", "switch_base_128", 0.1, 0.4, 85.2, 19.6, 83.7,
               73.0)]


def _rows():
    rows = []
    for label, model, dropout, expert, *published in _PUBLISHED:
        for (task_label, task), value in zip(_TASKS, published):
            match = {"finetune.task": task, "model": model, "dropout": dropout}
            if expert is not None:
                match["finetune.expert_dropout"] = expert
            rows.append(dict(label=f"{task_label}, {label}", match=match,
                             published=dict(task_score=value)))
    return rows


TABLE = dict(
    title="Switch Transformer Table 4: dropout and expert dropout when fine-tuning",
    source=(f"{_PAPER}. GLUE and SuperGLUE: averages over their tasks; CNNDM ROUGE-2; SQuAD "
            "exact match; the peak validation score of each fine-tune."),
    metric="task_score",
    columns=[("task_score", "paper")],
    ours=[("task_score", "ours")],
    rows=_rows(),
    command=("python train.py --config=configs/finetune.py:task=glue,model=switch_base_128,"
             "init_from=HF_DIR --config.finetune.expert_dropout=0.4 --workdir=runs/ft_glue_ed0.4"),
)
