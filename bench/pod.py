"""Pod-scale dry runs: the Switch paper's models on simulated pods, one subprocess per case.

    python bench/pod.py [--cases base_128_32 large_128_128 ...] [--timeout 900] [--out FILE]
    python bench/pod.py --cases switch_tiny:8 --length 32        # any MODEL:DEVICES[/MESH/LAYOUT]
    python bench/pod.py --dtype float32 --remat none --no-scan   # the unrolled float32 step

Each case runs ``python -m switchzoo.layout --devices N --json ...`` (the layout inspector) in a
fresh process that starts JAX on N simulated CPU devices, builds the train state abstractly
(nothing allocated) and compiles the real train step. Reported per case: parameter and optimizer
bytes per device, the compiled step's memory analysis per device, its collectives, compile
seconds, the subprocess's wall seconds and peak resident memory. A case that runs past
--timeout, or whose process grows past --max-rss-gb (or leaves the machine with less than
--min-available-gb), is stopped and recorded as such.

Choices (the Switch paper, arXiv 2101.03961):
  * Parallelism. Switch-Base and Switch-Large: data + expert parallelism, the paper's default
    (mesh data:D,model:1,expert:E with E = gcd(devices, experts) and D = devices / E; layout
    "batch:data+expert,experts:expert": the batch is split over every device, the experts over
    the expert axis, so 32 devices hold 4 of Switch-Base's 128 experts each, and 256 devices
    hold Switch-Large's 128 experts twice).
    Switch-C: expert parallelism only (mesh expert:2048, layout "batch:expert,experts:expert"),
    one expert per device, dense weights replicated, as the paper ran Switch-C.
  * Batch: one sequence of --length 512 tokens per device for the inputs and the targets (the
    model is an encoder-decoder), so 2048 devices hold the paper's 2^20 tokens per batch; with
    a 'model' axis, one per model replica (its devices split that sequence's work).
  * Routing groups: when a device holds fewer tokens than the catalogue's group, the group
    shrinks to the device's tokens (--group-size), so the groups split evenly over the devices
    and each device routes its own tokens. With the catalogue's groups (e.g. 2048 tokens for
    Switch-C) 2^20 tokens make 512 groups, which the layout cannot split over 2048 devices: the
    routing is then replicated (--catalogue-groups shows what that costs).
  * Optimizer: Adafactor, the paper's and the run configs' default (--optimizer adamw for Adam).
  * All-to-all: the inspector keeps each all-to-all one array op, as TPU does, instead of XLA's
    CPU rewrite into one slice per device (--cpu-decompose-all-to-all restores it), which at
    1,024+ devices makes the compile outgrow the host.
  * Activations bfloat16 as in the paper (parameters, router and optimizer state float32),
    every block rematerialised (--remat full: only block inputs are kept for the backward
    pass) and each stack scanned over its repeating (dense, sparse) group (--no-scan unrolls).
Numbers are those of XLA's CPU compiler for the per-device program; fusion, layouts and so
temporaries differ on TPU. bench/pod_fit.py searches the smallest slice that fits 16 GiB.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit, machine, parser

ROOT = Path(__file__).resolve().parents[1]

# name: (model, devices, mesh, layout); mesh None: data + expert (see the module doc).
CASES = {
    "base_128_32": ("switch_base_128", 32, None, "dp_ep"),
    "large_128_128": ("switch_large_128", 128, None, "dp_ep"),
    "large_128_256": ("switch_large_128", 256, None, "dp_ep"),
    "c_2048_2048": ("switch_c_2048", 2048, "expert:2048", "expert_parallel"),
}
DEFAULT_CASES = ("base_128_32", "large_128_128", "large_128_256", "c_2048_2048")
SUMMARY = ("devices", "mesh", "layout", "optimizer", "dtype", "scan_layers", "remat", "batch",
           "length", "group_size",
           "routing_groups", "params_bytes_total", "params_bytes_per_device_max",
           "opt_bytes_per_device_max", "memory", "collectives", "lower_seconds",
           "compile_seconds")


def resolve(spec: str) -> dict:
    """A case name from CASES, or ``MODEL:DEVICES[/MESH/LAYOUT]`` (data + expert by default)."""
    if spec in CASES:
        model, devices, mesh, layout = CASES[spec]
    else:
        head, *rest = spec.split("/")
        model, sep, n = head.partition(":")
        if not sep or not n.isdigit() or int(n) < 1 or len(rest) not in (0, 2):
            raise SystemExit(f"error: case {spec!r} is neither one of {sorted(CASES)} nor "
                             "MODEL:DEVICES[/MESH/LAYOUT] (e.g. switch_tiny:8 or "
                             "switch_tiny:8/expert:8/expert_parallel)")
        devices = int(n)
        mesh, layout = rest if rest else (None, "dp_ep")
    from switchzoo import zoo
    cfg = zoo.get(model)
    if mesh is None:
        experts = cfg.moe.num_experts if cfg.moe else 1
        e = math.gcd(devices, experts)
        mesh = f"data:{devices // e},model:1,expert:{e}"
    # The devices of one model replica (the 'model' axis) hold the same tokens.
    model_axis = int(dict(a.split(":") for a in mesh.split(",")).get("model", 1))
    return {"case": spec, "model": model, "devices": devices, "mesh": mesh, "layout": layout,
            "batch_shards": devices // model_axis,
            "catalogue_group_size": cfg.moe.group_size if cfg.moe else None}


def command(case: dict, args) -> list[str]:
    batch = case["batch_shards"] * args.per_device_batch
    cmd = [sys.executable, "-m", "switchzoo.layout", "--json", "--model", case["model"],
           "--devices", str(case["devices"]), "--mesh", case["mesh"], "--layout", case["layout"],
           "--optimizer", args.optimizer, "--batch", str(batch), "--length", str(args.length)]
    group = case["catalogue_group_size"]
    tokens_per_shard = args.per_device_batch * args.length
    if group is not None and not args.catalogue_groups and group > tokens_per_shard:
        cmd += ["--group-size", str(tokens_per_shard)]
    if args.cpu_decompose_all_to_all:
        cmd.append("--cpu-decompose-all-to-all")
    cmd += ["--dtype", args.dtype, "--remat", args.remat] + ([] if args.no_scan
                                                              else ["--scan-layers"])
    return cmd


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62


def run_case(case: dict, args) -> dict:
    """Runs one dry run; returns the case with its report's summary or why it stopped."""
    import json
    cmd = command(case, args)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(
        [f"--xla_force_host_platform_device_count={case['devices']}", *args.xla_flags.split()]))
    result = dict(case, command=" ".join(cmd[1:]))
    print(f"[pod] {case['case']}: {result['command']}", file=sys.stderr, flush=True)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err,
                                start_new_session=True)
        status, rss, usage = None, 0, None
        while True:
            pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(code)
                break
            rss = max(rss, _rss_bytes(proc.pid))
            elapsed = time.perf_counter() - start
            if elapsed > args.timeout:
                status = "timeout"
            elif rss > args.max_rss_gb * 2 ** 30:
                status = "rss_limit"
            elif _available_bytes() < args.min_available_gb * 2 ** 30:
                status = "machine_memory_low"
            if status:
                os.killpg(proc.pid, signal.SIGKILL)     # the session this script started
                _, _, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.5)
        result["wall_seconds"] = round(time.perf_counter() - start, 1)
        result["peak_rss_bytes"] = max(rss, usage.ru_maxrss * 1024 if usage else 0)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if status is None:
        status = "ok" if proc.returncode == 0 else "error"
    result["status"] = status
    if status == "ok":
        report = json.loads(stdout)
        result.update({k: report[k] for k in SUMMARY if k in report})
        result["tokens_per_batch"] = report["batch"] * report["length"]
    else:
        result["returncode"] = proc.returncode
        result["stderr_tail"] = stderr.strip().splitlines()[-3:]
    print(f"[pod] {case['case']}: {status} in {result['wall_seconds']} s, peak RSS "
          f"{result['peak_rss_bytes'] / 2 ** 30:.2f} GiB", file=sys.stderr, flush=True)
    return result


def add_step_arguments(p) -> None:
    """The train step's settings (shared with bench/pod_fit.py)."""
    p.add_argument("--length", type=int, default=512, help="tokens per sequence (inputs and "
                                                           "targets)")
    p.add_argument("--per-device-batch", type=int, default=1,
                   help="sequences per device (per model replica with a 'model' axis)")
    p.add_argument("--optimizer", default="adafactor", choices=("adafactor", "adamw"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="activation dtype (parameters, router and optimizer stay float32)")
    p.add_argument("--remat", default="full", choices=("none", "full", "dots"),
                   help="rematerialisation of each block / scanned group")
    p.add_argument("--no-scan", action="store_true", help="unroll the layers (no lax.scan)")
    p.add_argument("--catalogue-groups", action="store_true",
                   help="keep the catalogue's routing group size even when it spans devices")
    p.add_argument("--cpu-decompose-all-to-all", action="store_true",
                   help="keep XLA's CPU all-to-all rewrite (one slice per device; what made "
                        "Switch-C on 1,024+ devices outgrow the host)")
    p.add_argument("--max-rss-gb", type=float, default=16,
                   help="stop a case whose process grows past this many GiB")
    p.add_argument("--min-available-gb", type=float, default=2,
                   help="stop a case when the machine has less than this many GiB available")
    p.add_argument("--xla-flags", default="", help="more XLA_FLAGS for each case's process "
                   "(e.g. a test's --xla_backend_optimization_level=0)")


def step_config(args) -> dict:
    return {"length": args.length, "per_device_batch": args.per_device_batch,
            "optimizer": args.optimizer, "dtype": args.dtype, "remat": args.remat,
            "scan_layers": not args.no_scan, "timeout_s": args.timeout,
            "catalogue_groups": args.catalogue_groups,
            "cpu_decompose_all_to_all": args.cpu_decompose_all_to_all,
            "max_rss_gb": args.max_rss_gb,
            **({"xla_flags": args.xla_flags} if args.xla_flags else {})}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES),
                   help=f"names ({', '.join(CASES)}) or MODEL:DEVICES[/MESH/LAYOUT]")
    p.add_argument("--timeout", type=float, default=900, help="seconds per case")
    add_step_arguments(p)
    args = p.parse_args(argv)
    cases = [resolve(c) for c in args.cases]
    results = [run_case(c, args) for c in cases]
    emit({"machine": machine(),
          "config": step_config(args),
          "cases": results}, args.out)
    # A case stopped by a limit is a result; one whose inspector failed is an error.
    return 1 if any(r["status"] == "error" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
