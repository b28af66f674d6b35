"""A mini table's rows are runs of the recipe it names (README: configs/lm_cpu.py for the LM
tables, configs/demo.py for the translation one): the config.json such a run writes matches its
row and no other. configs/mini.py's tiny models are in no table, and collecting only them is a
one-line error naming the models the rows want, not a table of empty rows."""
import importlib.util
import json

import pytest

from switchzoo import registry, scores, tables

RECIPES = {"mtf_table3_wmt_mini": "configs/demo.py"}     # the others: configs/lm_cpu.py


def _config_json(path: str, variant: str) -> dict:
    """What train.py writes to config.json for --config=PATH:VARIANT (loop.save_config)."""
    spec = importlib.util.spec_from_file_location("_recipe", registry.config_path(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return json.loads(module.get_config(variant).to_json_best_effort())


def _minis() -> list[str]:
    return [n for n in tables.names() if n.endswith("_mini")]


def test_a_run_of_a_mini_rows_recipe_matches_that_row():
    assert len(_minis()) >= 4
    for name in _minis():
        table, recipe = tables.get(name), RECIPES.get(name, "configs/lm_cpu.py")
        assert recipe in table["source"] + table["command"], f"{name} names another recipe"
        for row in table["rows"]:
            if row["match"] is None:
                continue
            variant = ",".join(f"{k}={v}" for k, v in row["match"].items())
            config = _config_json(recipe, variant)
            hits = [r["label"] for r in table["rows"] if tables.matches(r, config)]
            assert hits == [row["label"]], (name, recipe, variant, hits)


def test_collecting_only_runs_of_no_row_is_an_error_naming_the_rows(tmp_path):
    run = tmp_path / "mini_switch_tiny"        # configs/mini.py's documented command
    run.mkdir()
    (run / "config.json").write_text(json.dumps(_config_json("configs/mini.py",
                                                             "model=switch_tiny")))
    scores.write_results(run, scores.make_results(10, "validation", total_nll=300.0,
                                                  num_tokens=100, num_words=80))
    with pytest.raises(ValueError, match="no run matches a row of switch_table1_mini: its rows "
                       "are models dense_lm_cpu, switch_lm_cpu_8, the runs' are switch_tiny"):
        tables.collect("switch_table1_mini", [str(run)])
