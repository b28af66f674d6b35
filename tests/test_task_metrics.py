"""Every shipped metric against values worked out by hand (in the comments), or from the
official scripts' rules, never from the function under test; to 1e-6."""
import pytest

from switchzoo.tasks import metrics

P, N = "positive", "negative"


def close(got: dict, want: dict):
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key


def test_accuracy_counts_an_invalid_output_wrong():
    # 2 of 4 right; the None (an output outside the label set) is wrong even where gold is N
    close(metrics.compute(["accuracy"], [P, N, None, P], [P, N, N, N]), {"accuracy": 50.0})


def test_binary_f1_of_the_positive_class():
    # TP 1 (first), FP 1 (last), FN 0: precision 1/2, recall 1 -> F1 2/3
    close(metrics.compute(["f1"], [P, N, None, P], [P, N, N, N], classes=(N, P)),
          {"f1": 200 / 3})
    # the positive class missed once, an invalid output where it was gold: TP 1, FN 2 -> 1/2
    close(metrics.compute(["f1"], [P, N, None], [P, P, P], classes=(N, P)), {"f1": 50.0})


def test_matthews():
    # TP 2, FN 1, TN 2, FP 1: (2*2 - 1*1) / sqrt(3*3*3*3) = 3/9
    close(metrics.compute(["matthews"], [1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 1, 0]),
          {"matthews_corr": 100 / 3})


def test_pearson_spearman_and_a_non_number():
    # x = (1, 2, 3), y = (1, 3, 2): deviations (-1, 0, 1), (-1, 1, 0): r = 1 / sqrt(2 * 2)
    close(metrics.compute(["pearson", "spearman"], ["1", "3", "2"], [1.0, 2.0, 3.0]),
          {"pearson_corr": 50.0, "spearman_corr": 50.0})
    # a non-number counts as -1 (T5's string_to_float): y = (-1, 3, 2) -> deviations
    # (-7/3, 5/3, 2/3) against (-1, 0, 1): cov 3, |x| sqrt 2, |y| sqrt(78/9): 3 / sqrt(17.333)
    close(metrics.compute(["pearson"], [None, "3", "2"], [1.0, 2.0, 3.0]),
          {"pearson_corr": 100 * 3 / (2 * 78 / 9) ** 0.5})


def test_macro_f1_over_the_task_classes():
    # e: TP 1 FN 1 -> 2/3; c: TP 1 FP 1 -> 2/3; n: TP 0 -> 0; mean 4/9
    classes = ("entailment", "contradiction", "neutral")
    close(metrics.compute(["macro_f1"], ["entailment", "contradiction", "contradiction", None],
                          ["entailment", "entailment", "contradiction", "neutral"],
                          classes=classes), {"macro_f1": 400 / 9})


def test_squad_official_normalisation():
    # "The Eiffel Tower!" -> "eiffel tower": exact; "in Paris France" vs "Paris": P 1/3, R 1
    # -> F1 1/2, no exact match; the best of two gold answers counts
    got = metrics.compute(["squad"], ["The Eiffel Tower!", "in Paris France"],
                          [("eiffel tower",), ("Paris", "London")])
    close(got, {"exact_match": 50.0, "f1": 75.0})
    assert metrics.normalize_answer("An  apple, the Pear.") == "apple pear"


def test_multirc_f1_over_answers_and_exact_match_per_question():
    # F1 of True: TP 1, FP 1 -> 2/3; question q1 all right, q2 not -> EM 1/2
    close(metrics.compute(["multirc"], ["True", "False", "True"], ["True", "False", "False"],
                          ["q1", "q1", "q2"]), {"f1": 200 / 3, "exact_match": 50.0})


def test_rouge():
    # "the cat sat" against "the cat sat on the mat": unigrams P 3/3 R 3/6 -> F 2/3; bigrams
    # P 2/2 R 2/5 -> F 4/7; one sentence: Lsum's LCS 3 -> as ROUGE-1
    close(metrics.compute(["rouge"], ["the cat sat"], ["the cat sat on the mat"]),
          {"rouge1": 200 / 3, "rouge2": 400 / 7, "rougeLsum": 200 / 3})


def test_bleu_perfect_and_empty():
    close(metrics.compute(["bleu"], ["a b c d e"], ["a b c d e"]), {"bleu": 100.0})
    close(metrics.compute(["bleu"], [None], ["a b c d e"]), {"bleu": 0.0})


def test_benchmark_average_counts_mnli_once():
    # tasks: mrpc (f1 80, acc 70) -> 75; mnli m 60 / mm 70 -> 65 together; cola 30
    per_task = {"glue_mrpc": {"f1": 80.0, "accuracy": 70.0},
                "glue_mnli_matched": {"accuracy": 60.0},
                "glue_mnli_mismatched": {"accuracy": 70.0}, "glue_cola": {"matthews_corr": 30.0}}
    assert metrics.benchmark_average(per_task) == pytest.approx((75 + 65 + 30) / 3)


def test_unknown_metric_and_one_without_labels_are_one_line():
    with pytest.raises(ValueError, match="unknown metric 'acc'; known: accuracy"):
        metrics.check(["acc"], None, "--config.finetune.metrics")
    with pytest.raises(ValueError, match="'f1' needs the task's labels"):
        metrics.check(["f1"], None, "--config.finetune.metrics")
