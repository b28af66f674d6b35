"""Evaluate a run, or collect runs into a paper's table.

    python eval.py --workdir=DIR                      # the run's newest checkpoint
    python eval.py --workdir=DIR --checkpoint=HF_DIR --config=configs/wmt.py
    python eval.py --table=switch_table1 --runs=DIR1,DIR2,...
    switchzoo-eval ...                                # the same, from an installed package
"""
import pathlib

from absl import app, flags, logging
from ml_collections import config_flags

from switchzoo import cli, evaluate, tables

config_flags.DEFINE_config_file("config", None, "Run config, when the workdir has none.")
flags.DEFINE_string("workdir", None, "The run to evaluate (results.json is written there).")
flags.DEFINE_string("checkpoint", "", "A Hugging Face directory to evaluate instead.")
flags.DEFINE_string("table", "", "Collect --runs into this paper table (see switchzoo.tables).")
flags.DEFINE_list("runs", [], "Run directories for --table.")
flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    cli.run(run_eval)


def run_eval():
    FLAGS = flags.FLAGS
    if FLAGS.table:
        print(tables.collect(FLAGS.table, FLAGS.runs))
        return
    if not FLAGS.workdir:
        raise ValueError("give --workdir=DIR (or --table=NAME --runs=DIR,...)")
    config = FLAGS.config or evaluate.load_config(pathlib.Path(FLAGS.workdir))
    evaluate.run(config, FLAGS.workdir, FLAGS.checkpoint)


def run():
    app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
    run()
