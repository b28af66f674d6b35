"""Train a switchzoo model; re-running the same command resumes from the newest checkpoint.

    python train.py --config=configs/demo.py --workdir=DIR [--config.num_train_steps=...]

The command lives in switchzoo/commands/train.py (installed as ``switchzoo-train``).
"""
from switchzoo.commands import entry

if __name__ == "__main__":
    entry.train()
