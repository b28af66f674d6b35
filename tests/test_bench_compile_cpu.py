"""bench/compile_cpu.py's arithmetic: its flag sets and its summary of the alternated runs. The
runs themselves (a training process per flag set and repetition, ~7 CPU-s each) are left to the
benchmark: the suite's time is what it serves."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

import compile_cpu  # noqa: E402


def test_flag_sets_are_labelled_and_a_set_without_a_label_is_one_line():
    sets = compile_cpu.flag_sets(["default=", "one=--xla_cpu_parallel_codegen_split_count=1"])
    assert sets == {"default": "", "one": "--xla_cpu_parallel_codegen_split_count=1"}
    with pytest.raises(SystemExit, match=r"--set '--xla_a=1': give LABEL=FLAGS"):
        compile_cpu.flag_sets(["--xla_a=1"])          # flags where the label belongs


def test_summary_gives_each_sets_mean_range_and_ratio_to_the_first():
    runs = {"default": [{"cpu_s": 8.0, "compile_s": 6.0}, {"cpu_s": 9.0, "compile_s": 7.0}],
            "one": [{"cpu_s": 6.0, "compile_s": 4.0}, {"cpu_s": 7.6, "compile_s": 5.0}]}
    s = compile_cpu.summary(runs)
    assert s["default"] == {"cpu_s_mean": 8.5, "cpu_s_range": [8.0, 9.0], "compile_s_mean": 6.5,
                            "runs": 2, "cpu_over_first": 1.0}
    assert s["one"]["cpu_s_mean"] == 6.8 and s["one"]["cpu_over_first"] == 0.8
    assert s["one"]["cpu_s_range"] == [6.0, 7.6]
