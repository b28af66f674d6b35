"""The layout inspector's numbers against arithmetic, and its command line."""
import functools
import json
import math
import pathlib
import subprocess
import sys

import pytest

from switchzoo import inspector

from conftest import FAST_COMPILE

ROOT = pathlib.Path(__file__).resolve().parent.parent
HLO = """
  %all-to-all.3 = (f32[4,1,5,64]{3,2,1,0}, f32[4,1,5,64]{3,2,1,0}) all-to-all(f32[4,1,5,64]{3,2,1,0} %a, f32[4,1,5,64]{3,2,1,0} %b), replica_groups={{0,1}}
  %all-reduce-start = f32[8]{0} all-reduce-start(f32[8]{0} %all-to-all.3), to_apply=%add
  %all-reduce-done = f32[8]{0} all-reduce-done(f32[8]{0} %all-reduce-start)
  %ag = f32[16]{0} all-gather(f32[8]{0} %all-reduce-done), dimensions={0}
  %cp = f32[16]{0} collective-permute(f32[16]{0} %ag), source_target_pairs={{0,1},{1,0}}
"""


@functools.lru_cache
def inspect_step(*args, **kwargs) -> dict:
    """inspector.inspect, once per set of arguments in this module: a report (which the tests
    only read) compiles the train step, and two tests read the same expert-parallel one."""
    return inspector.inspect(*args, **kwargs)


def test_collective_counting_reads_tuples_and_async_pairs_once():
    assert inspector.count_collectives(HLO) == {
        "all-to-all": 1, "all-reduce": 1, "all-gather": 1, "reduce-scatter": 0,
        "collective-permute": 1}


@pytest.mark.parametrize("mesh, preset, n", [
    ("expert:8", "expert_parallel", 8),
    ("data:2,model:1,expert:4", "dp_ep", 4),
    ("data:2,model:2,expert:2", "dp_mp_ep", 2),
])
def test_expert_axis_of_size_n_holds_one_nth_of_every_expert_weight(mesh, preset, n):
    report = inspect_step("switch_tiny", mesh, preset, batch_size=8, length=32)
    experts = [t for t in report["tensors"] if "experts" in t["dims"]]
    assert len(experts) == 3 * 2          # router, wi, wo in two sparse layers
    for t in experts:
        total = 4 * math.prod(t["shape"])
        split = 2 if "d_ff" in t["dims"] and "model" in report["mesh"] and \
            report["mesh"]["model"] == 2 else 1
        assert t["per_device_bytes"] * n * split == total, t
    assert report["collectives"]["all-to-all"] > 0
    per_device = sum(t["per_device_bytes"] for t in report["tensors"])
    assert report["params_bytes_per_device_max"] == per_device < report["params_bytes_total"]
    # AdamW keeps two moments per parameter, sharded like it, plus int32 step counts (Adam's
    # and the schedule's): once, and once per expert for the expert weights' transformation
    # (optim.per_layer runs it per expert: switch_tiny has 8).
    counters = 4 * 2 * (1 + 8)
    assert report["opt_bytes_per_device_max"] - 2 * per_device == counters


def test_pure_data_parallel_has_no_all_to_all_and_replicates_every_weight():
    report = inspector.inspect("switch_tiny", "data:8", "data_parallel")
    assert report["collectives"]["all-to-all"] == 0
    assert report["collectives"]["all-reduce"] > 0          # the gradient all-reduce
    assert report["params_bytes_per_device_max"] == report["params_bytes_total"]


def test_command_line_json_table_and_figure(tmp_path, capfd):
    """The command line's own work (its flags, --json, --figure, one-line errors) through
    inspector.main, which ``python -m switchzoo.layout`` runs (that module's start in a fresh
    process: test_devices_flag_reruns_on_that_many_simulated_devices). The step it compiles is
    the dp_mp_ep one above (the same batch and length: read back from the compilation cache)."""
    base = ["--model", "switch_tiny", "--mesh", "data:2,model:2,expert:2", "--layout", "dp_mp_ep"]
    figure = tmp_path / "wi.png"
    capfd.readouterr()
    code = inspector.main(base + ["--batch", "8", "--length", "32", "--json", "--figure",
                                  str(figure), "--tensor", "decoder/layers/1/ffn/wi"])
    out = capfd.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert set(report) >= {"devices", "mesh", "layout", "params_bytes_total",
                           "params_bytes_per_device_max", "opt_bytes_per_device_max",
                           "tensors", "collectives"}
    assert report["devices"] == 8 and report["collectives"]["all-to-all"] > 0
    assert figure.stat().st_size > 1000
    code = inspector.main(base[:-2] + ["--layout", "batch:data,experts:exprt", "--no-compile"])
    bad = capfd.readouterr()
    assert code == 2 and not bad.out
    assert bad.err.strip().count("\n") == 0 and "did you mean 'expert'" in bad.err
    assert "Traceback" not in bad.err


def test_encoder_decoder_models_inspect_and_their_dispatch_is_all_to_all():
    report = inspector.inspect("switch_base_tiny", "data:2,model:1,expert:4", "dp_ep")
    assert report["collectives"]["all-to-all"] > 0
    names = {t["name"] for t in report["tensors"]}
    assert "encoder/layers/1/ffn/wi" in names and "decoder/layers/1/cross/q" in names


def test_memory_analysis_of_the_compiled_step_is_reported_per_device():
    report = inspect_step("switch_tiny", "expert:8", "expert_parallel", batch_size=8,
                          length=32)
    m = report["memory"]
    for key in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
                "peak_estimate_bytes"):
        assert m[key] > 0, (key, m)
    assert m["peak_estimate_bytes"] == (m["argument_bytes"] + m["output_bytes"]
                                        - m["alias_bytes"] + m["temp_bytes"])
    # The state is donated, so the new state reuses its buffers: most of the output is aliased.
    state = report["params_bytes_per_device_max"] + report["opt_bytes_per_device_max"]
    assert state <= m["argument_bytes"] and m["alias_bytes"] >= state
    assert report["batch"] == 8 and report["length"] == 32 and report["routing_groups"] == 8
    assert "peak estimate" in inspector.format_table(report)


def test_devices_flag_reruns_on_that_many_simulated_devices(capfd):
    # This process already runs 8 devices, so --devices 4 must start a fresh process.
    rc = inspector.main(["--model", "switch_tiny", "--mesh", "expert:4", "--layout",
                         "expert_parallel", "--devices", "4", "--no-compile", "--json"])
    assert rc == 0
    report = json.loads(capfd.readouterr().out)
    assert report["devices"] == 4 and report["mesh"] == {"expert": 4}
    assert "memory" not in report                   # --no-compile


def test_pod_bench_runs_a_small_case_end_to_end(tmp_path):
    out = tmp_path / "pod.json"
    run = subprocess.run([sys.executable, "bench/pod.py", "--cases", "switch_tiny:4",
                          "--length", "32", "--timeout", "120", "--out", str(out),
                          f"--xla-flags={FAST_COMPILE}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert json.loads(run.stdout) == result
    (case,) = result["cases"]
    assert case["status"] == "ok", case
    # data + expert: the 8 experts over 4 devices, one sequence (one routing group) per device
    assert case["mesh"] == {"data": 1, "model": 1, "expert": 4}
    assert case["batch"] == 4 and case["routing_groups"] == 4
    assert case["memory"]["peak_estimate_bytes"] > 0 and case["collectives"]["all-to-all"] > 0
    assert case["wall_seconds"] >= case["compile_seconds"] > 0


def test_pod_bench_records_a_case_past_its_timeout_and_goes_on():
    run = subprocess.run([sys.executable, "bench/pod.py", "--cases", "switch_tiny:4",
                          "--timeout", "0.5"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    (case,) = json.loads(run.stdout)["cases"]
    assert case["status"] == "timeout" and "memory" not in case


def test_cpu_inspection_keeps_all_to_all_whole_and_the_callers_disabled_passes(monkeypatch):
    # XLA's CPU rewrite of an all-to-all into one slice per device is what made Switch-C's step
    # outgrow the host at 1,024+ simulated devices; the inspector compiles without it.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                    "--xla_disable_hlo_passes=foo")
    assert inspector.cpu_inspect_options() == {
        "xla_disable_hlo_passes": "foo,all_to_all_decomposer"}
