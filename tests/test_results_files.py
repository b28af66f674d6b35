"""What a fine-tune's evaluation leaves for the tables: Table 5's rows from fine-tuned runs,
and results files of their own for evaluations of another set (switchzoo.tables,
switchzoo.record)."""
from switchzoo import tables
from test_scores import _row, _run


def test_fine_tunes_fill_table5_with_seeds_scored_at_different_best_steps(tmp_path):
    """Table 5's rows match fine-tunes by task and model; two seeds of one fine-tune (their best
    checkpoints at different steps) are one row, the mean of their task scores."""
    def fine_tune(name, model, seed, best_step, score):
        config = {"task": "text2text", "finetune": {"task": "glue"}, "num_train_steps": 400}
        return _run(tmp_path, name, model, best_step, {
            "step": best_step, "split": "validation", "task_score": score,
            "tasks": {"glue_sst2": {"accuracy": score}}}, seed=seed, config=config)
    runs = [fine_tune("t5_s0", "t5_base", 0, 200, 80.0), fine_tune("t5_s1", "t5_base", 1, 350, 82.0),
            fine_tune("sw", "switch_base_128", 0, 400, 85.5)]
    text = tables.collect("switch_table5", runs)
    assert "| 84.3 | 81 |" in _row(text, "GLUE, T5-Base")           # paper | ours (mean)
    assert "| 86.7 | 85.5 |" in _row(text, "GLUE, Switch-Base")
    assert "| 75.1 | \u2014 |" in _row(text, "SuperGLUE, T5-Base")


def test_an_evaluation_that_measures_less_gets_its_own_results_file(tmp_path):
    """The README's perplexity-only command keeps the run's results.json (its BLEU); a
    fine-tune scored on another split gets its own file too."""
    from switchzoo import record
    from switchzoo.configs import base, finetune
    own = base.get_base()
    (tmp_path / "config.json").write_text(own.to_json())
    assert record.results_names(own, tmp_path)[0] == "results.json"
    lesser = base.get_base()
    lesser.eval.max_examples = 0
    name, _, what = record.results_names(lesser, tmp_path)
    assert name.startswith("results-perplexity_only-") and "eval.max_examples=0" in what
    tuned = finetune.get_config("task=glue_sst2")
    (tmp_path / "config.json").write_text(tuned.to_json())
    tuned.finetune.eval_split = "test"
    assert record.results_names(tuned, tmp_path)[0].startswith("results-test-")
