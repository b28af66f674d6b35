"""A published study's verdicts again, from its JSON alone (no runs needed): lm_claims.claims or
routing_family.findings recomputed on docs/<name>.json's runs with today's arithmetic (the one
noise rule, switchzoo.noise), the numbers the runs measured left as they are.

    python experiments/rejudge.py lm_claims span_claims routing_family_lm   # prints them
    python experiments/rejudge.py lm_claims --publish                      # replaces them

The judge is the one of the script that wrote the result (its "command": lm_claims.py,
span_claims.py, routing_family.py --regime lm). Without --publish nothing is written.
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
import routing_family  # noqa: E402

# the script that wrote a result (its "command") -> the key of its verdicts and their judge
JUDGES = {"lm_claims.py": ("claims", lm_claims.claims),
          "span_claims.py": ("claims", lm_claims.claims),
          "routing_family.py": ("findings", routing_family.findings)}


def judge_of(result: dict) -> tuple[str, object]:
    """(key, judge) for a result, from the script its command names; SystemExit (one line) for
    a result these cannot judge."""
    words = result.get("command", "").split()
    script = pathlib.Path(words[1]).name if len(words) > 1 else ""
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+", help="studies: docs/NAME.json (lm_claims, span_claims, "
                   "routing_family_lm, span_long ...)")
    harness.publish_argument(p)
    args = p.parse_args(argv)
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
        import orderings                  # the table of every published verdict
        print(f"wrote {orderings.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
