"""Evaluation metrics: BLEU on detokenized text, token- and word-level perplexity, routing
statistics, and the results.json a finished eval leaves in its workdir.

Running the model (beam search, summing the NLL, sowing the routing metrics) is eval.py's job;
everything here is a pure function of numbers and strings, so it is tested without a model.

results.json (one per workdir, rewritten by each eval of the run's own evaluation set; other
sets write results-NAME-HASH.json beside it, switchzoo.record.results_names):
    {"step", "split", "bleu" (or null), "token_perplexity", "word_perplexity" (or null), "loss",
     "neg_log_perplexity", "dropped_fraction": [per Switch layer],
     "expert_load": [[per Switch layer, per expert]], ...any extra keys the caller adds}
"""
from __future__ import annotations

import json
import math
import pathlib

from switchzoo import atomic

RESULTS_FILE = "results.json"
_SPM_MARK = "\u2581"     # SentencePiece's word-boundary mark: its presence means undecoded pieces


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (0-100) with sacrebleu's default 13a tokenizer, on detokenized text.

    BLEU is only comparable across papers when it is computed on detokenized output with a
    standard tokenizer (Post 2018), so pass tokenizer.decode(ids), never subword pieces.
    """
    import sacrebleu  # imported here: training never needs it

    if len(hypotheses) != len(references):
        raise ValueError(f"bleu: {len(hypotheses)} hypotheses but {len(references)} references; "
                         "pass one reference per hypothesis, in the same order")
    if not hypotheses:
        raise ValueError("bleu: no hypotheses; the eval split produced no examples")
    for name, texts in (("hypotheses", hypotheses), ("references", references)):
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"bleu: {name}[{bad}] is {type(texts[bad]).__name__}, not str; "
                             "decode token ids to text first")
        if any(_SPM_MARK in t for t in texts):
            raise ValueError(f"bleu: {name} contain SentencePiece '{_SPM_MARK}' marks; BLEU wants "
                             "detokenized text: use tokenizer.decode(ids), not the pieces")
    return float(sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a").score)


def count_words(texts: list[str], eos: bool = True) -> int:
    """Words for word-level perplexity: whitespace-separated words, plus one end-of-sentence per
    text when eos=True. The summed NLL includes each text's EOS prediction, and the one-billion-
    word benchmark counts its </S> as a word too, so the default keeps numerator and
    denominator over the same events."""
    return sum(len(t.split()) + (1 if eos else 0) for t in texts)


def perplexities(total_nll: float, num_tokens: int, num_words: int | None) -> dict:
    """Token- and word-level perplexity from one summed negative log-likelihood (nats).

    total_nll: sum over every predicted subword token of -log p, EOS included, padding excluded.
    num_tokens: the number of those predicted tokens.
    num_words: the number of words the same text holds (count_words), or None when no word
        count applies (translation).

    The word level is the Mesh-TensorFlow / LM1B convention: the same subword NLL divided by the
    word count, exp(total_nll / num_words). It does not depend on the subword vocabulary, so
    models with different tokenizers compare; t2t's lm1b32k gives about 1.1078 tokens per word,
    so word log-ppl ~= 1.1078 x token log-ppl there.

    Returns {"loss": nats per token, "neg_log_perplexity": -loss (the Switch paper's quality
    metric), "token_perplexity": exp(loss), "word_perplexity": exp(nll / words) or None}.
    """
    if not (isinstance(num_tokens, int) and num_tokens > 0):
        raise ValueError(f"perplexities: num_tokens must be a positive int, got {num_tokens!r} "
                         "(an eval split with no target tokens?)")
    if num_words is not None and not (isinstance(num_words, int) and num_words > 0):
        raise ValueError(f"perplexities: num_words must be a positive int or None, got "
                         f"{num_words!r}")
    total_nll = float(total_nll)
    if not math.isfinite(total_nll) or total_nll < 0:
        raise ValueError(f"perplexities: total_nll must be a finite sum of -log p >= 0, got "
                         f"{total_nll} (NaN or inf means the eval diverged or summed padding)")
    loss = total_nll / num_tokens
    return {
        "loss": loss,
        "neg_log_perplexity": -loss,
        "token_perplexity": math.exp(loss),
        "word_perplexity": math.exp(total_nll / num_words) if num_words else None,
    }


def make_results(step: int, split: str, *, total_nll: float, num_tokens: int,
                 num_words: int | None = None, bleu: float | None = None,
                 dropped_fraction=(), expert_load=(), **extra) -> dict:
    """The results.json dict, in one shape for every eval.

    dropped_fraction: [layers] fraction of tokens each Switch layer dropped at the eval capacity.
    expert_load: [layers, experts] fraction of routed tokens each expert received.
    """
    results = {"step": int(step), "split": split, "bleu": None if bleu is None else float(bleu)}
    results.update(perplexities(total_nll, num_tokens, num_words))
    results["dropped_fraction"] = [float(x) for x in dropped_fraction]
    results["expert_load"] = [[float(x) for x in layer] for layer in expert_load]
    results.update(extra)
    return results


def _jsonable(x):
    if hasattr(x, "tolist"):                      # numpy / jax arrays and scalars
        return x.tolist()
    raise TypeError(f"results.json: {type(x).__name__} is not JSON-serialisable")


def write_results(workdir, results: dict, name: str = RESULTS_FILE) -> pathlib.Path:
    """Write workdir/results.json (or ``name``: another evaluation set's, switchzoo.record)
    atomically (switchzoo.atomic), so a reader (tables.collect, a crashed eval) never sees
    half a file."""
    text = json.dumps(results, indent=1, default=_jsonable, allow_nan=False) + "\n"
    return atomic.write_text(pathlib.Path(workdir) / name, text)


def read_results(workdir) -> dict:
    path = pathlib.Path(workdir) / RESULTS_FILE
    if not path.is_file():
        raise ValueError(f"{workdir}: no {RESULTS_FILE}; run `python eval.py --workdir={workdir}` "
                         "first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def routing_summary(results: dict) -> dict:
    """Mean dropped fraction over Switch layers and the min / max expert load, or {} for dense."""
    out = {}
    dropped = results.get("dropped_fraction") or []
    if dropped:
        out["dropped_fraction_mean"] = sum(dropped) / len(dropped)
    loads = [x for layer in results.get("expert_load") or [] for x in layer]
    if loads:
        out["expert_load_min"], out["expert_load_max"] = min(loads), max(loads)
        out["experts"] = len(results["expert_load"][0])
    return out


def fmt(value, exact: bool = False) -> str:
    """A table cell: '—' for missing, floats to 4 significant digits (exact: as written, for
    published numbers), anything else as str."""
    if value is None:
        return "\u2014"
    if isinstance(value, float) and not exact:
        return f"{value:.4g}"
    return str(value)


def markdown(results: dict) -> str:
    """A two-column Markdown table of the metrics present in a results dict."""
    rows = [("split", results.get("split")), ("step", results.get("step"))]
    for key, label in (("bleu", "BLEU (sacrebleu 13a)"), ("loss", "loss (nats/token)"),
                       ("neg_log_perplexity", "neg. log perplexity (Switch paper)"),
                       ("accuracy", "token accuracy"),
                       ("token_perplexity", "token perplexity"),
                       ("word_perplexity", "word perplexity")):
        if results.get(key) is not None:
            rows.append((label, results[key]))
    for task, got in (results.get("tasks") or {}).items():     # a fine-tune's task metrics
        rows += [(f"{task} {k}", v) for k, v in got.items() if k != "headline"]
    summary = routing_summary(results)
    if "dropped_fraction_mean" in summary:
        n = len(results["dropped_fraction"])
        rows.append((f"dropped fraction (mean of {n} Switch layers)",
                     summary["dropped_fraction_mean"]))
    if "expert_load_min" in summary:
        rows.append((f"expert load min / max (uniform = 1/{summary['experts']} = "
                     f"{fmt(1 / summary['experts'])})",
                     f"{fmt(summary['expert_load_min'])} / {fmt(summary['expert_load_max'])}"))
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {label} | {fmt(value)} |" for label, value in rows if value is not None]
    return "\n".join(lines)
