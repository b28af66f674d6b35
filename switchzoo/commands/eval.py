"""Evaluate a run, or collect runs into a paper's table.

    python eval.py --workdir=DIR                      # the run's newest checkpoint
    python eval.py --workdir=DIR --config.eval.num_beams=8 --config.data.eval_files=test.tsv
    python eval.py --workdir=DIR --checkpoint=HF_DIR --config=configs/wmt.py
    python eval.py --workdir=DIR --predict=inputs.txt [--predictions=out.txt]  # your inputs
    python eval.py --table=switch_table1 --runs=DIR1,DIR2,...
    switchzoo-eval ...                                # the same, from an installed package

The entry points (the script and the installed command) call switchzoo.commands.entry.evaluate,
which first re-runs the process with glibc's huge-page tunable (entry.huge_pages_env);
``python -m`` on this module skips that.
"""
import pathlib

from absl import app, flags, logging
from ml_collections import config_flags

from switchzoo import evaluate, predict, tables, validate
from switchzoo.configs import base
from switchzoo.commands import cli

config_flags.DEFINE_config_file("config", None, "Run config, when the workdir has none; without "
                                "it, --config.FIELD=value overrides the run's saved config "
                                "(evaluate.EVAL_OVERRIDES names what may change).")
flags.DEFINE_string("workdir", None, "The run to evaluate (results.json is written there).")
flags.DEFINE_string("checkpoint", "", "A Hugging Face directory (or another run's workdir) "
                    "to evaluate instead.")
flags.DEFINE_string("output", "", "Write results.json (and translations) into this directory "
                    "instead of the workdir: for a run on a read-only mount.")
flags.DEFINE_string("predict", "", "A file of inputs, one per line ('-': stdin): write the "
                    "run's output for each (translations; a fine-tune's answers) instead of "
                    "scoring it.")
flags.DEFINE_string("predictions", "-", "With --predict: the file the outputs go to ('-': "
                    "stdout).")
flags.DEFINE_string("table", "", "Collect --runs into this paper table (see switchzoo.tables).")
flags.DEFINE_list("runs", [], "Run directories for --table.")
flags.DEFINE_bool("check", False, "Check the flags, the table or the run's config with the "
                  "overrides as the command would, then stop: nothing is evaluated or written.")
flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")
cli.define_distributed_flags()
OVERRIDES = {}     # --config.FIELD=value given without --config=FILE: of the saved config


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    cli.run(run_eval)


def run_eval():
    FLAGS = flags.FLAGS
    if FLAGS.table:
        cli.refuse_distributed_flags("--table reads results.json files and")
        if FLAGS.check:
            tables.get(FLAGS.table)
            print(f"check: table {FLAGS.table} exists (nothing was read or written)")
            return
        print(tables.collect(FLAGS.table, FLAGS.runs))
        return
    if not FLAGS.workdir:
        raise ValueError("give --workdir=DIR (or --table=NAME --runs=DIR,...)")
    if FLAGS["predictions"].present and not FLAGS.predict:
        raise ValueError("--predictions is read only with --predict=FILE; add it or drop "
                         "--predictions")
    if FLAGS.predict and FLAGS.output:
        raise ValueError("--output is for results.json; with --predict give --predictions=FILE")
    if FLAGS.check:
        _check(pathlib.Path(FLAGS.workdir))
        return
    config = FLAGS.config or evaluate.load_config(pathlib.Path(FLAGS.workdir), OVERRIDES)
    cli.initialize_distributed()        # every process evaluates its share of the eval set
    if FLAGS.predict:
        predict.run(config, FLAGS.workdir, FLAGS.predict, FLAGS.predictions, FLAGS.checkpoint)
        return
    evaluate.run(config, FLAGS.workdir, FLAGS.checkpoint, output=FLAGS.output)


def _check(workdir: pathlib.Path) -> None:
    """--check: the run's saved config (or --config) with the overrides, checked as evaluation
    checks them; a workdir with no run yet checks the overrides against the defaults."""
    FLAGS = flags.FLAGS
    if FLAGS.config:
        config, source = FLAGS.config, "--config"
    elif (workdir / "config.json").is_file():
        config, source = evaluate.load_config(workdir, OVERRIDES), f"{workdir}/config.json"
    else:                       # no run yet: the overrides' names and types, as eval.py takes them
        evaluate.apply_overrides(base.get_base(), OVERRIDES)
        print(f"check: the overrides are fields eval.py may set (no run in {workdir} yet to "
              "check them against; nothing was evaluated or written)")
        return
    validate.check(config, evaluating=True)
    print(f"check: the flags and the overrides hold on {source} (nothing was evaluated or "
          "written)")


def parse_flags(argv):
    """cli.parse_flags; without --config=FILE, each --config.FIELD=value is kept for the run's
    saved config (absl knows such flags only for a config file)."""
    if not any(a.startswith("--config=") for a in argv[1:]):
        rest = []
        for arg in argv:
            name, sep, value = arg.partition("=")
            if not name.startswith("--config."):
                rest.append(arg)
            elif sep:
                OVERRIDES[name[len("--config."):]] = value
            else:
                cli.bad_flag(f"{arg}: write overrides as --config.FIELD=value")
        argv = rest
    return cli.parse_flags(argv)


def run():
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
