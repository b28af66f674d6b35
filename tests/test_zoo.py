"""The catalogue in models/: every entry builds, published parameter figures agree with counts
from abstract shapes at the precision they were printed, FLOPs follow their definition, and
the CLI lists everything."""
import json
import subprocess
import sys

import jax
import pytest

from switchzoo import zoo
from switchzoo.config import ModelConfig

NAMES = zoo.names()
PUBLISHED = {n: zoo.entry(n)["published"] for n in NAMES if "params" in zoo.entry(n).get(
    "published", {})}


def test_switch_c_2048_is_counted_from_abstract_shapes():
    # 1.6T float32 parameters are 6 TB: counting them can only succeed from abstract shapes.
    zoo._param_shapes.cache_clear()
    before = len(jax.live_arrays())
    n = zoo.count_params("switch_c_2048")
    assert round(n / 1e9) == 1571
    assert len(jax.live_arrays()) <= before, "counting left arrays allocated"


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_builds_a_model_config_and_names_its_source(name):
    cfg = zoo.get(name)
    assert isinstance(cfg, ModelConfig)
    assert zoo.entry(name)["source"].strip()
    assert set(zoo.entry(name)) - set(zoo.META_KEYS) <= {f.name for f in
                                                        ModelConfig.__dataclass_fields__.values()}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts_agree_at_their_precision(name):
    published, n = PUBLISHED[name], zoo.count_params(name)
    figures = {k: v for k, v in published.items() if k.startswith("params") and k != "params_text"}
    if "mismatch" in published:
        # An honest config that cannot reach the figure says why; if it starts to agree (e.g.
        # gated experts land), the note is stale.
        assert not zoo.agrees(n, published["params"]), f"{name}: remove the stale mismatch note"
        return
    for key, figure in figures.items():
        assert zoo.agrees(n, figure), f"{name}: {n:,} parameters do not round to {key}={figure}"


def test_the_switch_paper_table9_figures_are_all_catalogued():
    table9 = {"t5_base": "0.2B", "t5_large": "0.7B", "switch_base_128": "7B",
              "switch_large_128": "26B", "switch_xxl": "395B", "switch_c_2048": "1571B"}
    for name, figure in table9.items():
        published = zoo.entry(name)["published"]
        assert figure in (published["params"], published.get("params_table9")), name


def test_mtf_lm1b_rows_scale_heads_and_d_ff_and_match_the_published_counts():
    rows = [n for n in NAMES if n.startswith("mtf_lm1b_h")]
    assert [zoo.get(n).num_heads for n in rows] == [4, 8, 16, 32, 64, 128, 256]
    for name in rows:
        cfg = zoo.get(name)
        assert (cfg.d_model, cfg.d_kv, cfg.d_ff) == (1024, 256, 1024 * cfg.num_heads)
        assert zoo.agrees(zoo.count_params(name), zoo.entry(name)["published"]["params"])


def test_agrees_reads_the_printed_precision():
    assert zoo.agrees(247_577_856, "0.2B") and not zoo.agrees(783_150_080, "0.7B")
    assert zoo.agrees(222_903_552, "223M") and not zoo.agrees(737_668_096, "739M")
    assert zoo.agrees(1_275_083_776, "1.28B") and zoo.agrees(4_898_960_384, "4.90B")
    with pytest.raises(ValueError, match="suffix"):
        zoo.agrees(1, "seven billion")


def test_flops_per_token_of_a_dense_lm_by_hand():
    cfg = zoo.get("dense_tiny")
    D, H, K, F, V, L = cfg.d_model, cfg.num_heads, cfg.d_kv, cfg.d_ff, cfg.vocab_size, 512
    weights = cfg.num_layers * (4 * D * H * K + 2 * D * F) + V * D   # tied output layer
    attention = cfg.num_layers * 4 * L * H * K
    assert zoo.flops_per_token(cfg, seq_len=L) == 2 * weights + attention


def test_switch_flops_count_one_expert_so_they_match_the_dense_model_plus_routers():
    for sparse, dense in (("switch_tiny", "dense_tiny"), ("switch_base_256", "t5_base")):
        cfg = zoo.get(sparse)
        layers = (sum(cfg.moe.is_sparse(i) for i in range(cfg.num_layers)) +
                  sum(cfg.moe.is_sparse(i, True) for i in range(cfg.num_encoder_layers)))
        router = 2 * cfg.d_model * cfg.moe.num_experts * layers
        assert zoo.flops_per_token(sparse) == zoo.flops_per_token(dense) + router


def test_cli_lists_every_name_with_its_counts():
    rows = {r["name"]: r for r in (zoo.describe(n) for n in NAMES)}
    assert list(rows) == NAMES
    assert rows["switch_c_2048"]["experts"] == 2048 and rows["t5_base"]["experts"] == 0
    assert all(r["agrees"] or r["mismatch"] for r in rows.values() if r["published_params"])


def test_cli_runs_as_a_module():
    base = [sys.executable, "-m", "switchzoo.zoo"]
    out = subprocess.run(base + ["switch_tiny", "t5_tiny"], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines()[0].split()[:4] == ["name", "params", "published", "experts"]
    assert "switch_tiny" in out and "t5_tiny" in out
    rows = json.loads(subprocess.run(base + ["--json", "switch_base_tiny"], capture_output=True,
                                     text=True, check=True).stdout)
    assert rows[0]["name"] == "switch_base_tiny" and rows[0]["params"] > 0
    bad = subprocess.run(base + ["switch_basee_8"], capture_output=True, text=True)
    assert bad.returncode == 2 and "did you mean 'switch_base_8'" in bad.stderr


def test_top2_expert_flops_count_the_picks_its_capacity_serves_by_hand():
    """switch_tiny: d_model 64, d_ff 128, 8 experts, 2 Switch layers, groups of 32 tokens. A
    served pick costs 2 x (wi + wo) / E = 2 x (2 x 64 x 128) = 32,768 FLOPs a layer, 65,536 over
    both. Capacity is round(32 x factor / 8) slots an expert whatever top_k is: at 1.25 that is
    5 x 8 = 40 slots for 32 tokens, 1.25 served picks a token (not top-2's 2); at 2.0, 64 slots,
    both picks; at 1.0, 32 slots, one pick (as top-1)."""
    import dataclasses
    cfg = zoo.get("switch_tiny")
    top1 = zoo.flops_per_token(cfg)

    def top2(cf):
        return zoo.flops_per_token(cfg.replace(moe=dataclasses.replace(
            cfg.moe, top_k=2, train_capacity_factor=cf)))
    assert top1 == 821_248
    assert top2(1.0) == 821_248
    assert top2(1.25) == 821_248 + 16_384          # + 0.25 x 65,536, not + 65,536
    assert top2(2.0) == 821_248 + 65_536
    # min_capacity 4: groups of 8 tokens over 4 experts get 16 slots, so both picks are served
    from switchzoo.config import MoeConfig
    assert zoo.served_picks(MoeConfig(num_experts=4, top_k=2, group_size=8,
                                      train_capacity_factor=1.25)) == 2.0
    assert zoo.served_picks(MoeConfig(num_experts=4, top_k=2, group_size=8,
                                      train_capacity_factor=1.25, dispatch="dropless")) == 2.0
    assert zoo.served_picks(MoeConfig(num_experts=8, top_k=2, group_size=0,
                                      train_capacity_factor=1.25), seq_len=64) == 1.25


def test_the_span_studys_one_stack_switch_models_have_one_switch_layer():
    dense = zoo.get("dense_sc_cpu")
    for name, encoder, decoder in (("switch_sc_cpu_8_dec", [False, False], [False, True]),
                                   ("switch_sc_cpu_8_enc", [False, True], [False, False])):
        cfg = zoo.get(name)
        assert [cfg.moe.is_sparse(i, True) for i in range(cfg.num_encoder_layers)] == encoder
        assert [cfg.moe.is_sparse(i) for i in range(cfg.num_layers)] == decoder
        # seven more experts' FFN (two matrices each, no biases) and one router matrix
        extra = 7 * 2 * cfg.d_model * cfg.d_ff + cfg.d_model * cfg.moe.num_experts
        assert zoo.count_params(name) == zoo.count_params("dense_sc_cpu") + extra
    # the same FLOPs (a token through one expert) and the router, per position of its stack
    router = 2 * dense.d_model * 8
    assert zoo.flops_per_token("switch_sc_cpu_8_dec") == zoo.flops_per_token(dense) + router
