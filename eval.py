"""Evaluate a run, or collect runs into a paper's table.

    python eval.py --workdir=DIR                      # the run's newest checkpoint
    python eval.py --workdir=DIR --checkpoint=HF_DIR --config=configs/wmt.py
    python eval.py --table=switch_table1 --runs=DIR1,DIR2,...

The command lives in switchzoo/commands/eval.py (installed as ``switchzoo-eval``).
"""
from switchzoo.commands import entry

if __name__ == "__main__":
    entry.evaluate()
