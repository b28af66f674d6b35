"""Writes the results part of docs/benchmarks.md (between its results markers) and the plots
in docs/figures/ from the JSON files of bench/run_all.py.

    python bench/report.py [--results out/bench] [--doc docs/benchmarks.md]
"""
import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _load(folder: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _gb(n) -> str:
    return f"{n / 2 ** 20:,.1f} MiB"


def _gib(n) -> str:
    return f"{n / 2 ** 30:,.2f} GiB"


def goals_table(results: dict) -> list[str]:
    lines = ["| benchmark | goal | measured | met |", "|---|---|---|---|"]
    for bench, r in results.items():
        for name, g in r.get("goals", {}).items():
            lines.append(f"| {bench}: {name.replace('_', ' ')} | {g['goal']} | {g['value']} | "
                         f"{'yes' if g['met'] else '**no**'} |")
    return lines


def train_step_section(r: dict, figures: Path) -> list[str]:
    c = r["config"]
    lines = ["### Train step (`bench/train_step.py`)", "",
             f"Decoder-only LM, d_model {c['d_model']}, d_ff {c['d_ff']}, {c['layers']} layers, "
             f"{c['heads']} heads, vocab {c['vocab']}, batch {c['batch']} x {c['length']} "
             f"tokens, AdamW, float32; Switch: {c['experts']} experts in every other FFN, "
             f"capacity factor {c['capacity_factor']}, groups of {c['group_size']} tokens. "
             f"Matmul peak (2048^3 float32, same run): "
             f"{r['matmul_peak_flops_per_s'] / 1e9:.0f} GFLOP/s.", "",
             "| case | mesh | step s | tokens/s | compile s | hand FLOPs / XLA cost FLOPs |",
             "|---|---|---|---|---|---|"]
    for name, case in r["cases"].items():
        lines.append(f"| {name} | {case['mesh']} | {case['step_s']} | {case['tokens_per_s']} | "
                     f"{case['compile_s']} | {r['hand_over_cost_analysis_flops'].get(name, '-')} |")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6, 3))
    ax = fig.subplots()
    names = list(r["cases"])
    ax.bar(names, [r["cases"][n]["step_s"] for n in names], color=[
        "tab:gray" if n.startswith("dense") else "tab:blue" if "einsum" in n else "tab:orange"
        for n in names])
    ax.set_ylabel("seconds per train step")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.set_title("train step: dense vs Switch (einsum / dropless), 1 and 8 devices", fontsize=8)
    fig.tight_layout()
    fig.savefig(figures / "bench_train_step.png", dpi=120)
    lines += ["", "![train step](figures/bench_train_step.png)", ""]
    return lines


def memory_section(r: dict, figures: Path) -> list[str]:
    s = r["state_bytes"]
    lines = ["### Memory (`bench/memory.py`)", "",
             f"Parameters + AdamW state of the train-step Switch model under {r['config']['layout']}"
             f" on ({r['config']['mesh']}): {_gb(s['measured_max'])} on the fullest device "
             f"(XLA's argument bytes without the batch: {_gb(s['xla_argument_minus_batch'])}); "
             f"ideal {_gb(s['ideal'])}; all devices together hold {_gb(s['total'])} once "
             f"(a device holds {s['fraction_of_total']} of it).", "",
             "Temporary bytes of one Switch layer's forward + backward (XLA memory analysis), "
             f"{r['config']['dispatch_layer']['tokens']} tokens, by routing group size:", "",
             "| group size | " + " | ".join(r["dispatch_temp_bytes"]) + " |",
             "|---|" + "---|" * len(r["dispatch_temp_bytes"])]
    groups = list(next(iter(r["dispatch_temp_bytes"].values())))
    for g in groups:
        lines.append(f"| {g} | " + " | ".join(_gb(t[g]) for t in r["dispatch_temp_bytes"].values())
                     + " |")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    for d, t in r["dispatch_temp_bytes"].items():
        ax.plot([int(g) for g in t], [v / 2 ** 20 for v in t.values()], marker="o", label=d)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("routing group size (tokens)")
    ax.set_ylabel("temp MiB (fwd + bwd)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(figures / "bench_dispatch_memory.png", dpi=120)
    lines += ["", "![dispatch memory](figures/bench_dispatch_memory.png)", ""]
    return lines


def pipeline_section(r: dict) -> list[str]:
    p, t, c = r["pipeline"], r["train_step"], r["config"]
    return ["### Input pipeline (`bench/pipeline.py`)", "",
            f"{c['config']} ({c['model']}, batch {c['batch']} x {c['length']}, packed): the "
            f"pipeline delivers {p['batches_per_s']} batches/s ({p['target_tokens_per_s']:,.0f} "
            f"target tokens/s); the train step consumes {t['batches_per_s']} batches/s "
            f"({t['step_s']} s/step).", ""] + pod_hosts_lines(r.get("pod_hosts"))


def pod_hosts_lines(pod: dict | None) -> list[str]:
    """One host of an H-host pod: its input at its own share (per-host input) and, before it,
    the whole global batch on every host, each over what the host's devices consume."""
    if not pod:
        return []
    lines = [f"One host of an H-host pod, consuming {pod['consumed_target_tokens_per_s']:,.0f} "
             "target tokens/s (the demo step on this host's device):", "",
             "| hosts | this host's share, tokens/s | share / consumption (per-host input) | "
             "before: whole batch / (H x consumption) |", "|---|---|---|---|"]
    for h, v in pod["hosts"].items():
        lines.append(f"| {int(h):,} | {v['share_tokens_per_s']:,.0f} | "
                     f"{v['after_share_over_consumption']} | "
                     f"{v['before_whole_over_h_x_consumption']} |")
    return lines + [""]


def decode_section(r: dict) -> list[str]:
    lines = ["### Decoding (`bench/decode.py`)", "",
             f"Greedy, KV cache, prompt {r['config']['prompt']}, {r['config']['new_tokens']} new "
             "tokens, one device.", "", "| model | batch | new tokens/s | compile + first s |",
             "|---|---|---|---|"]
    for c in r["cases"]:
        lines.append(f"| {c['model']} | {c['batch']} | {c['tokens_per_s']:,} | "
                     f"{c['compile_plus_first_s']} |")
    return lines + [""]


def peer_series_section(r: dict) -> list[str]:
    """bench/peer_series.py: each ratio's median (min-max) over fresh-process runs."""
    c, run = r["config"], r["runs"][0]
    src = r["source"]
    lines = ["### Against transformers (`bench/peer_series.py`: `bench/peer.py` in fresh "
             "processes, thread settings alternating)", "",
             f"The same weights (a `SwitchTransformersConfig`: d_model {c['d_model']}, d_ff "
             f"{c['d_ff']}, {c['encoder_layers']}+{c['decoder_layers']} layers, "
             f"{c['num_experts']} experts in every other FFN, capacity {c['expert_capacity']} "
             f"per sequence, vocab {c['vocab_size']}), batch {c['batch']} x {c['length']}; "
             f"transformers {run['transformers'].get('transformers', '')}, torch "
             f"{run['transformers'].get('torch', '')}. Commit `{(src['commit'] or '?')[:7]}` "
             f"(tree clean: {src['tree_clean']}); environment {r['env'] or 'as is'}; logits "
             f"and greedy tokens agree in every run: "
             f"{all(row['correct'] for row in r['by_threads'].values())}.", "",
             "| threads | runs | train ratio, median (min-max) | decode ratio, median (min-max) "
             "| switchzoo train tok/s | transformers train tok/s | ms per further token "
             "(switchzoo / transformers) | load at start |", "|---|---|---|---|---|---|---|---|"]
    for threads, row in r["by_threads"].items():
        tr = row["train_tokens_per_s_over_transformers"]
        de = row["decode_tokens_per_s_over_transformers"]
        ours, theirs = row["switchzoo"], row["transformers"]
        lines.append(
            f"| {threads} | {len(tr['runs'])} | **{tr['median']}** ({tr['min']}-{tr['max']}) | "
            f"**{de['median']}** ({de['min']}-{de['max']}) | "
            f"{ours['train_tokens_per_s']['median']:,.0f} | "
            f"{theirs['train_tokens_per_s']['median']:,.0f} | "
            f"{ours['decode_per_further_token_ms']['median']} / "
            f"{theirs['decode_per_further_token_ms']['median']} | "
            f"{', '.join(map(str, row['load_average_1min_at_start']))} |")
    return lines + [""]


def peer_section(r: dict, figures: Path) -> list[str]:
    if "by_threads" in r:
        return peer_series_section(r)
    c, ours, theirs = r["config"], r["switchzoo"], r["transformers"]
    lines = ["### Against transformers (`bench/peer.py`)", "",
             f"The same weights (a `SwitchTransformersConfig`: d_model {c['d_model']}, d_ff "
             f"{c['d_ff']}, {c['encoder_layers']}+{c['decoder_layers']} layers, "
             f"{c['num_experts']} experts in every other FFN, capacity {c['expert_capacity']} "
             f"per sequence, vocab {c['vocab_size']}), batch {c['batch']} x {c['length']}, "
             f"{c['threads']} threads on both sides ({theirs.get('transformers', '')} / torch "
             f"{theirs.get('torch', '')}); max logit difference "
             f"{r['correctness']['max_abs_logit_diff']:.1e}, greedy tokens equal: "
             f"{r['correctness']['greedy_tokens_equal']}.", "",
             "| | switchzoo | transformers | ratio |", "|---|---|---|---|",
             f"| train tokens/s (AdamW step) | {ours['train_tokens_per_s']:,.0f} | "
             f"{theirs['train_tokens_per_s']:,.0f} | "
             f"{r['goals']['train_tokens_per_s_over_transformers']['value']} |",
             f"| greedy decode tokens/s ({c['new_tokens']} new) | "
             f"{ours['decode_tokens_per_s']:,.0f} | {theirs['decode_tokens_per_s']:,.0f} | "
             f"{r['goals']['decode_tokens_per_s_over_transformers']['value']} |"]
    if "decode_split" in ours:
        lines.append(f"| decode: ms per further token | "
                     f"{ours['decode_split']['per_further_token_step_ms']} | "
                     f"{theirs['decode_split']['per_further_token_step_ms']} | |")
    return lines + [""]


def pod_section(r: dict) -> list[str]:
    cfg = r["config"]         # results from before dtype / remat / scan were recorded: f32 etc.
    lines = ["### Pod-scale dry run (`bench/pod.py`)", "",
             f"Train step compiled for N simulated CPU devices from abstract state (nothing "
             f"allocated); {cfg['optimizer']}, one sequence of {cfg['length']} tokens per "
             f"device (inputs and targets), {cfg.get('dtype', 'float32')} activations, remat "
             f"{cfg.get('remat', 'none')}, {'scanned' if cfg.get('scan_layers') else 'unrolled'}"
             " layers. Bytes per device.", "",
             "| case | devices | mesh | params | optimizer | arguments | temporaries | "
             "peak estimate | all-to-all | all-reduce | all-gather | compile s | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["cases"]:
        if c.get("status") != "ok":
            lines.append(f"| {c['case']} | {c['devices']} | | {c.get('status')} |" + " |" * 9)
            continue
        m, k = c["memory"], c["collectives"]
        mesh = ",".join(f"{a}:{n}" for a, n in c["mesh"].items())
        lines.append(
            f"| {c['case']} | {c['devices']} | {mesh} | {_gib(c['params_bytes_per_device_max'])} "
            f"| {_gib(c['opt_bytes_per_device_max'])} | {_gib(m['argument_bytes'])} | "
            f"{_gib(m['temp_bytes'])} | {_gib(m['peak_estimate_bytes'])} | {k['all-to-all']} | "
            f"{k['all-reduce']} | {k['all-gather']} | {c['compile_seconds']} | "
            f"{c['wall_seconds']} |")
    return lines + [""]


def pipeline_parallel_section(r: dict) -> list[str]:
    lines = ["### Pipeline parallelism (`bench/pipeline_parallel.py`)", "",
             f"{r['model']} with {r['layers']} layers, {r['rows_per_data_shard']} sequences of "
             f"{r['length']} tokens per data shard, {r['optimizer']}, remat {r['remat']}; the "
             "stages on 8 simulated devices, the rest on data. Per device:", "",
             "| stages | micro-batches | rounds | params | optimizer | temporaries | "
             "layer GFLOP | measured idle | schedule's bubble |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['stages']} | {row['microbatches']} | {row['rounds']} | "
                     f"{row['params_bytes_per_device'] / 1e6:.2f} MB | "
                     f"{row['opt_bytes_per_device'] / 1e6:.2f} MB | "
                     f"{row['temp_bytes_per_device'] / 1e6:.1f} MB | "
                     f"{row['layer_flops_per_device'] / 1e9:.2f} | "
                     f"{row['measured_idle_fraction']:.4f} | {row['schedule_bubble']:.4f} |")
    return lines + [""]


def generic_section(name: str, r: dict) -> list[str]:
    body = {k: v for k, v in r.items() if k not in ("machine", "goals", "bench")}
    return [f"### {name} (`bench/{name}.py`)", "", "```json", json.dumps(body, indent=1),
            "```", ""]


def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--results", default="out/bench")
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    args = p.parse_args()
    results = _load(Path(args.results))
    if not results:
        raise SystemExit(f"error: no results in {args.results}; run bench/run_all.py first")
    figures = Path(args.doc).parent / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    m = next(iter(results.values()))["machine"]
    commits = ", ".join(f"{name} `{(r.get('machine', {}).get('commit') or '?')[:7]}`"
                        for name, r in results.items())
    lines = [START, "", f"Machine: {m['cpu']}, {m['cores']} cores, {m['backend']} backend, "
             f"JAX {m['jax']}, Python {m['python']}. Commit of each result: {commits}.", "",
             "#### Every goal", "",
             *goals_table(results), ""]
    sections = {"train_step": lambda r: train_step_section(r, figures),
                "memory": lambda r: memory_section(r, figures),
                "pipeline": pipeline_section, "decode": decode_section}
    sections.update({"peer": lambda r: peer_section(r, figures), "pod": pod_section,
                     "pipeline_parallel": pipeline_parallel_section})
    for name, r in results.items():
        lines += sections.get(name, lambda r, n=name: generic_section(n, r))(r)
    lines.append(END)
    doc = Path(args.doc)
    text = doc.read_text() if doc.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        raise SystemExit(f"error: {doc} lacks the {START} / {END} markers; add them where the "
                         "results go")
    head, rest = text.split(START, 1)
    doc.write_text(head + "\n".join(lines) + rest.split(END, 1)[1])
    print(f"wrote {doc} and {figures}/bench_*.png")


if __name__ == "__main__":
    main()
