"""bench/gpu.py --smoke: every case runs at toy sizes on CPU, each in its own process, and
results.json holds each with status ok and the figures the GPU run is for. Timings are not
checked (the machine is shared). Every part of every case must run: "unsupported" is for a
tree without an option the script measures, which this one has."""
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402


def parts(case: dict) -> dict:
    return {k: v for k, v in case.items() if isinstance(v, dict) and "status" in v}


# Every kind of case whose code no other test runs: the other train steps (Switch index and
# einsum, dropless 8 and 64) run the dense case's code on other configs (and the index dispatch
# runs in switch_base_8 and the profile); the peer case runs bench/peer.py's Pair, which
# tests/test_bench_peer.py runs; grouped_matmul times the kernels tests/test_dropless.py checks.
# The suite leaves those to `python bench/gpu.py --smoke` (~2 min more).
KINDS = ("environment", "train_dense", "attention", "switch_base_8", "profile")
# train_dense at one remat policy: its others (minimal at full size) run the same code on
# another config, and are the baseline of train cases this smoke does not run.


@pytest.mark.timeout(1700)       # five processes, each compiling; ~1 min on an idle 2-core CPU
def test_smoke_runs_every_kind_of_case(tmp_path):
    proc = subprocess.run([sys.executable, "bench/gpu.py", "--smoke", "--out", str(tmp_path),
                           "--budget", "1500", "--only", ",".join(KINDS), "--remats", "none"],
                          capture_output=True, text=True, cwd=ROOT, timeout=1600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "results.json").read_text())
    cases = r["cases"]
    assert list(cases) == list(KINDS)                  # in the order --only gives
    for name, case in cases.items():
        assert case["status"] == "ok", (name, case.get("reason"))
        for key, part in parts(case).items():       # every option this tree has runs
            assert part["status"] == "ok", (name, key, part)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json", "results.json"]

    env = cases["environment"]
    assert env["matmul_flops_per_s"]["bfloat16"] > 0 and env["hbm_bytes_per_s"]["read_write"] > 0
    assert env["versions"]["jax"] and env["device"]["kind"]
    attention = cases["attention"]
    for impl in ("reference", "xla"):
        if attention[impl]["status"] == "ok":
            err = attention[impl]["max_abs_err"]
            assert set(err) == {"logits", "grads", "bias_grad"}
            assert err["logits"] < 0.1 * attention["config"]["max_abs_truth"]["logits"]
    for name in [n for n in cases if n.startswith("train_")] + ["switch_base_8"]:
        for key, part in parts(cases[name]).items():
            if part["status"] == "ok":
                assert part["step_s"] > 0 and part["flops_xla"] > 0 and part["memory"]
                assert part["mfu_measured"] > 0 and part["mfu_spec"] is None   # a CPU
    dense = cases["train_dense"]["remat_none"]
    assert 0.8 < dense["xla_over_hand"] < 1.25, dense       # the hand count is XLA's
    assert cases["switch_base_8"]["fits_without_remat"]
    assert cases["profile"]["top_scopes"] and cases["profile"]["step_ms"] > 0
    assert r["summary"]["matmul_bf16_flops_per_s"] > 0


def test_a_case_that_fails_or_runs_out_of_time_is_recorded(tmp_path, monkeypatch):
    """The parent records a child's failure and its time limit, and moves on; a case with
    no budget left is skipped, not started."""
    monkeypatch.setattr(gpu, "LIMITS", {"environment": 1, "attention": 45, "peer": 90})
    monkeypatch.setattr(gpu, "SMOKE_LIMIT", 1)
    monkeypatch.setattr(gpu, "MIN_START", 0.6)
    r = gpu.main(["--smoke", "--out", str(tmp_path), "--only", "environment,attention",
                  "--budget", "1.5"])
    assert r["cases"]["environment"]["status"] == "timeout"
    assert r["cases"]["attention"]["status"] == "skipped"
    assert json.loads((tmp_path / "results.json").read_text())["cases"] == r["cases"]
    assert not list(tmp_path.glob(".case-*"))
    assert gpu.status_of({"config": {}, "a": {"status": "ok"}, "b": {"status": "error"}}) == (
        "error", "failed: b")
    assert gpu.status_of({"a": {"status": "unsupported", "reason": "r"}}) == ("ok", None)


def test_a_part_keeps_what_it_measured_before_it_failed(tmp_path):
    """A step timed before its FLOP count failed (CUDA's lowered programs have no cost
    analysis in jax 0.11: the first H100 run lost every timing this way) keeps the timing."""
    import gpu_cases
    rec = gpu_cases.Record(tmp_path / "case.json")

    def measured_then_failed():
        gpu_cases.partial(rec, "remat_none")({"step_s": 0.05})
        assert json.loads((tmp_path / "case.json").read_text())["remat_none"]["step_s"] == 0.05
        raise TypeError("'NoneType' object is not subscriptable")
    out = rec.part("remat_none", measured_then_failed)
    assert out["status"] == "error" and out["step_s"] == 0.05
    assert json.loads((tmp_path / "case.json").read_text())["remat_none"]["step_s"] == 0.05
