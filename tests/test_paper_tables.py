"""The shipped paper tables (switchzoo.tables): every table loads with its published cells,
Switch Table 1's rows, and the one-line refusals of bad tables."""
import pytest

from switchzoo import tables
from test_scores import _run


def test_every_shipped_table_loads():
    assert {"switch_table1", "switch_table1_mini", "mtf_table2_lm1b", "mtf_table2_lm1b_mini",
            "mtf_table3_wmt", "mtf_table3_wmt_mini", "switch_figure4_mini"} <= set(tables.names())
    assert "switch_figure4" not in tables.names()                   # a MINI-only module
    from switchzoo import zoo
    models = set(zoo.names())
    for name in tables.names():
        table = tables.get(name)
        assert table["title"] and table["source"] and table["command"]
        for row in table["rows"]:
            assert row["label"] and isinstance(row["published"], dict)
            assert row["match"] is None or row["match"].get("model") in models, (name, row)
        if name.endswith("_mini"):
            assert table.get("orderings"), name
            # what the row is, or the paper's figure for the row it stands for: nothing else
            assert all(v is None or k.startswith("paper_") or k in (
                "capacity_factor", "top_k", "experts", "heads", "d_ff")
                for row in table["rows"] for k, v in row["published"].items())
        assert tables.collect(name, []).startswith(f"## {table['title']}")


def test_switch_table1_rows():
    rows = {r["label"]: r for r in tables.get("switch_table1")["rows"]}
    assert rows["T5-Base"]["published"]["neg_log_perplexity"] == -1.731
    for cf, nlp in ((1.0, -1.561), (1.25, -1.553), (2.0, -1.554)):
        row = rows[f"Switch-Base {cf}"]
        assert row["match"]["moe.train_capacity_factor"] == cf and row["match"]["moe.top_k"] == 1
        assert row["published"]["neg_log_perplexity"] == nlp
    top2 = [r for r in rows.values() if r["match"] and r["match"].get("moe.top_k") == 2]
    assert sorted(r["published"]["capacity_factor"] for r in top2) == [1.0, 1.25, 2.0]


def test_table_errors(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'switch_table1'"):
        tables.get("switch_tabel1")
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        tables.collect("switch_table1", [str(bare)])
    unfinished = _run(tmp_path, "unfinished", "t5_base", 0)
    with pytest.raises(ValueError, match="no results.json; run `python eval.py"):
        tables.collect("switch_table1", [unfinished])
    with pytest.raises(ValueError, match="does not exist"):
        tables.collect("switch_table1", [str(tmp_path / "nope")])
    assert tables.main(["--table=nope"]) == 2


def test_mtf_tables_print_every_published_cell():
    """Mesh-TF Tables 2 and 3 as the paper prints them (EN-DE and EN-FR): no None left."""
    t2, t3 = tables.get("mtf_table2_lm1b"), tables.get("mtf_table3_wmt")
    for table in (t2, t3):
        assert all(v is not None for row in table["rows"] for v in row["published"].values())
    lm = {r["label"]: r["published"] for r in t2["rows"]}
    assert (lm["mtf_lm1b_h4"]["word_perplexity"], lm["mtf_lm1b_h256"]["wiki_subword_perplexity"]
            ) == (35.0, 6.01)
    mt = {r["label"]: r["published"] for r in t3["rows"]}
    assert (mt["mtf_wmt_h32"]["bleu_en_de"], mt["mtf_wmt_h128"]["bleu_en_fr"]) == (27.5, 43.9)
    text = tables.collect("mtf_table3_wmt", [])
    assert "25.5" in text and "41.8" in text and "None" not in text

