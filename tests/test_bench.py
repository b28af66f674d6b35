"""bench/train_step.py and bench/memory.py at toy sizes: they run, their goals are consistent
with their values, the hand FLOP count agrees with XLA's cost analysis, and the state bytes per
device equal the ideal. Timings are not checked (the machine is shared)."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(script, *flags, tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, f"bench/{script}", "--out", str(out), *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    for name, goal in result["goals"].items():
        op, bound = goal["goal"].split()
        assert goal["met"] == (goal["value"] <= float(bound) if op == "<=" else
                               goal["value"] >= float(bound)), name
    return result


def test_train_step_bench(tmp_path):
    r = run("train_step.py", "--d-model", "64", "--layers", "2", "--vocab", "512", "--batch",
            "8", "--length", "32", "--group-size", "32", "--repeats", "1", "--compiles", "1",
            tmp_path=tmp_path)
    assert set(r["cases"]) == {f"{m}_{n}" for m in ("dense", "switch_index", "switch_einsum",
                                                          "switch_dropless")
                               for n in (1, 8)}
    # The hand count (3 x forward matmul FLOPs) against XLA's own count of the dense step.
    assert 0.9 < r["hand_over_cost_analysis_flops"]["dense_1"] < 1.1
    assert 0.9 < r["hand_over_cost_analysis_flops"]["dense_8"] < 1.1
    # The index dispatch executes fewer FLOPs than the one-hot einsums it replaces.
    assert (r["cases"]["switch_index_1"]["flops_cost_analysis"]
            < r["cases"]["switch_einsum_1"]["flops_cost_analysis"])
    assert r["machine"]["devices"] == 8 and r["matmul_peak_flops_per_s"] > 0


def test_memory_bench(tmp_path):
    r = run("memory.py", "--d-model", "128", "--tokens", "1024", tmp_path=tmp_path)
    state = r["state_bytes"]
    assert state["measured_max"] == state["ideal"] == state["measured_min"]
    assert abs(state["xla_argument_minus_batch"] - state["ideal"]) <= 8   # the step counter
    einsum = r["dispatch_temp_bytes"]["einsum"]
    assert einsum["4096"] > einsum["64"]           # capacity slots grow with the group
