"""experiments/expert_swap.py: its rotation moves every expert weight and nothing else (routers
and other stacks untouched), k = E is the model itself, a rotated tiny model scores otherwise,
and its one-line errors."""
import pathlib
import sys

import jax
import numpy as np

from switchzoo import data, steps, zoo
from switchzoo import state as state_lib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))

import expert_swap as swap  # noqa: E402


def test_rotation_rolls_expert_weights_along_their_experts_dim_alone():
    E = 4
    params = {"encoder": {"moe": {"wi": np.arange(E * 2 * 3).reshape(E, 2, 3),
                                  "router": {"w": np.arange(2 * E).reshape(2, E)}}},
              "decoder": {"scanned": {"wo": np.arange(2 * E * 3).reshape(2, E, 3)},
                          "mlp": {"wi": np.arange(6).reshape(2, 3)}}}
    dims = {"encoder/moe/wi": ("experts", "d_model", "d_ff"),
            "encoder/moe/router/w": ("d_model", "experts"),
            "decoder/scanned/wo": ("layers", "experts", "d_ff"),
            "decoder/mlp/wi": ("d_model", "d_ff")}
    out = swap.rotated(params, dims, 1)
    np.testing.assert_array_equal(out["encoder"]["moe"]["wi"][1],
                                  params["encoder"]["moe"]["wi"][0])
    np.testing.assert_array_equal(out["encoder"]["moe"]["wi"][0],
                                  params["encoder"]["moe"]["wi"][E - 1])
    np.testing.assert_array_equal(out["decoder"]["scanned"]["wo"][:, 2],
                                  params["decoder"]["scanned"]["wo"][:, 1])   # experts: axis 1
    for same in (("encoder", "moe", "router", "w"), ("decoder", "mlp", "wi")):
        a, b = out, params
        for k in same:
            a, b = a[k], b[k]
        np.testing.assert_array_equal(a, b)
    alone = swap.rotated(params, dims, 1, "decoder")
    np.testing.assert_array_equal(alone["encoder"]["moe"]["wi"], params["encoder"]["moe"]["wi"])
    np.testing.assert_array_equal(alone["decoder"]["scanned"]["wo"],
                                  out["decoder"]["scanned"]["wo"])
    full = swap.rotated(params, dims, E)
    np.testing.assert_array_equal(full["encoder"]["moe"]["wi"], params["encoder"]["moe"]["wi"])


def test_a_tiny_switch_model_scores_itself_at_k_e_and_otherwise_rotated():
    cfg = zoo.get("switch_tiny")                      # decoder-only, Switch layers 1 and 3
    setup = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1])
    params = setup.init()
    eval_step = steps.make_eval_step(setup)
    batches = [next(data.byte_lm_batches(4, 32, seed=3))]
    own = swap.held_out_loss(eval_step, params, batches)
    E = cfg.moe.num_experts
    assert swap.held_out_loss(eval_step, swap.rotated(params, setup.dims, E), batches) == own
    assert abs(swap.held_out_loss(eval_step, swap.rotated(params, setup.dims, 1), batches)
               - own) > 1e-4


def test_errors_are_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "eval.txt").write_text("one text\n")
    for args, words in ((["--workdir", str(tmp_path / "missing")], "no config.json"),
                        (["--workdir", str(tmp_path), "--examples", "0"], "positive count")):
        code = swap.main([*args, "--corpus", str(corpus), "--json", str(tmp_path / "o.json")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("error: ") and words in err and "\n" not in err, err
    assert not (tmp_path / "o.json").exists()
