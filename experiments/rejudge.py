"""Published studies' verdicts again, from their JSON alone (no runs needed), with today's
arithmetic (the one noise rule, switchzoo.noise); the numbers the runs measured are left as
they are.

    python experiments/rejudge.py lm_claims span_claims routing_family_lm   # prints them
    python experiments/rejudge.py lm_claims --publish                      # replaces them
    python experiments/rejudge.py --all [--publish]    # every docs/*.json; lists what changed

A result written by lm_claims.py, span_claims.py, lr_sweep.py or routing_family.py --regime
lm is judged by that script's own judge (lm_claims.claims, lr_sweep.at_best_claims,
routing_family.findings) on its runs. --all
re-judges every other study's verdicts from their recorded same-seed gaps (noise.rejudge:
the paired rule needs nothing else), and prints each verdict whose words changed. Without
--publish nothing is written.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
import lm_claims  # noqa: E402
import lr_sweep  # noqa: E402
import orderings  # noqa: E402
import routing_family  # noqa: E402
from switchzoo import noise  # noqa: E402

# the script that wrote a result (its "command") -> the key of its verdicts and their judge
JUDGES = {"lm_claims.py": ("claims", lm_claims.claims),
          "span_claims.py": ("claims", lm_claims.claims),
          "routing_family.py": ("findings", routing_family.findings),
          "lr_sweep.py": ("at_best", lambda r: lr_sweep.at_best_claims(r, r["best"]))}
# --all: the judges that read every run they need from the result itself (routing_family's
# findings also read other seeds' results: re-judged verdict by verdict instead)
WHOLE = ("lm_claims.py", "span_claims.py", "lr_sweep.py")


def script_of(result: dict) -> str:
    words = result.get("command", "").split()
    return pathlib.Path(words[1]).name if len(words) > 1 else ""


def judge_of(result: dict) -> tuple[str, object]:
    """(key, judge) for a result, from the script its command names; SystemExit (one line) for
    a result these cannot judge."""
    words, script = result.get("command", "").split(), script_of(result)
    if script not in JUDGES or (script == "routing_family.py" and "lm" not in words):
        raise SystemExit(f"error: {result.get('study', 'this result')} was written by "
                         f"{script or 'no command'}; "
                         f"rejudge reads the results of {', '.join(sorted(JUDGES))} "
                         "(routing_family.py: --regime lm)")
    return JUDGES[script]


def rejudge(result: dict) -> dict:
    """``result`` with its verdicts (claims or findings) recomputed."""
    key, judge = judge_of(result)
    return {**result, key: judge(result)}


def rejudge_any(result: dict) -> dict:
    """``result`` re-judged: by its script's judge where that reads only this result, else
    verdict by verdict from the recorded gaps."""
    script = script_of(result)
    if script in WHOLE and (script != "lr_sweep.py" or "best" in result):
        key, judge = JUDGES[script]          # its own key by its judge, the rest by the walk
        return {**{k: v if k == "runs" else _walk(v) for k, v in result.items()},
                key: judge(result)}
    return _walk(result)


def _walk(x):
    if isinstance(x, list):
        return [_walk(v) for v in x]
    if not isinstance(x, dict):
        return x
    if orderings.KEYS <= set(x):
        c = noise.rejudge(x)
        if "goal" in c and "holds" in c and c["beyond_noise"] is not None:
            c["holds"] = c["better"] and c["beyond_noise"]
        return c
    return {k: noise.RULE if k == "noise_rule" else _walk(v) for k, v in x.items()}


def changes(old: dict, new: dict, study: str) -> list[dict]:
    """The verdicts whose words differ between two versions of a study's result."""
    before = {path: c["verdict"] for path, _, c in orderings.verdicts(old)}
    out = []
    for path, runs, c in orderings.verdicts(new):
        if path in before and before[path] != c["verdict"]:
            out.append({"study": study, "claim": path.lstrip("/"), "runs": runs,
                        "seeds": c["seeds"], "gaps": c["gaps"], "margin": c["margin"],
                        "noise": c["noise"], "df": c.get("df"), "was": before[path],
                        "now": c["verdict"]})
    return out


def rejudge_all(publish: bool) -> list[dict]:
    changed = []
    for path in sorted(harness.DOCS.glob("*.json")):
        old = json.loads(path.read_text())
        if not any(True for _ in orderings.verdicts(old)):
            continue
        new = rejudge_any(old)
        changed += changes(old, new, path.stem)
        if publish and new != old:
            path.write_text(json.dumps(new, indent=1) + "\n")
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="studies: docs/NAME.json (lm_claims, span_claims, "
                   "routing_family_lm, span_long ...)")
    p.add_argument("--all", action="store_true", help="every published study's verdicts")
    harness.publish_argument(p)
    args = p.parse_args(argv)
    if args.all == bool(args.names):
        raise SystemExit("error: name the studies to re-judge, or pass --all (not both)")
    if args.all:
        changed = rejudge_all(args.publish)
        print(json.dumps(changed, indent=1))
        print(f"{len(changed)} verdicts changed")
        if args.publish:
            print(f"wrote {orderings.write()}")
        return 0
    for name in args.names:
        path = harness.DOCS / f"{name}.json"
        if not path.is_file():
            raise SystemExit(f"error: no {path}; pass the name of a published study")
        result = rejudge(json.loads(path.read_text()))
        key = judge_of(result)[0]
        print(f"== {name}: {key}\n" + json.dumps(result[key], indent=1))
        if args.publish:
            path.write_text(json.dumps(result, indent=1) + "\n")
            print(f"wrote {path}")
    if args.publish:
        print(f"wrote {orderings.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
