"""experiments/grad_noise.py: its noise and signal estimates on gradients with known answers,
a measurement of a tiny trained Switch LM (each expert's slice on its own), and its one-line
errors."""
import json
import pathlib
import sys

import numpy as np
import pytest

from switchzoo import loop
from switchzoo.configs import mini

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import grad_noise  # noqa: E402


def test_noise_and_signal_known_answers():
    # two gradients G + d and G - d: mean G, one batch's variance 2|d|^2, |G|^2 unbiased
    G, d = np.array([3.0, 4.0]), np.array([1.0, -2.0])
    out = grad_noise.noise_of(np.stack([G + d, G - d]))
    assert out["noise"] == pytest.approx(10.0) and out["signal"] == pytest.approx(25.0 - 5.0)
    assert out["nsr"] == pytest.approx(0.5)
    # many draws of N(G, s^2 I) in n dims: nsr -> n s^2 / |G|^2
    rng = np.random.default_rng(0)
    G = rng.normal(size=50)
    draws = G + 0.5 * rng.normal(size=(4000, 50))
    assert grad_noise.noise_of(draws)["nsr"] == pytest.approx(50 * 0.25 / (G @ G), rel=0.05)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("grad_noise")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, size=rng.integers(2, 7))) for _ in range(300)]
    for split, n in (("train", 400), ("eval", 60)):
        (corpus / f"{split}.txt").write_text("\n".join(
            " ".join(rng.choice(words, size=12)) for _ in range(n)) + "\n")
    config = mini.get_config("model=switch_tiny,steps=2")
    config.data.source, config.data.pair = "files", "en-de"
    config.data.train_files = str(corpus / "train.txt")
    config.data.eval_files = str(corpus / "eval.txt")
    config.per_device_batch_size, config.max_length, config.data.vocab_size = 1, 32, 64
    config.layout, config.mesh, config.eval_every_steps = "data_parallel", "data:-1", 0
    loop.train(config, root / "switch", print_fn=lambda *_: None)
    config.scan_layers = True               # the same run with each stack scanned
    loop.train(config, root / "scanned", print_fn=lambda *_: None)
    return root


def test_measures_each_expert_and_each_dense_ffn_of_a_trained_run(trained, tmp_path):
    out = tmp_path / "noise.json"
    assert grad_noise.main(["--workdir", str(trained / "switch"), "--corpus",
                            str(trained / "corpus"), "--batches", "3", "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert (run["model"], run["step"], run["batch"], run["batches"]) == ("switch_tiny", 2, 8, 3)
    m = run["matrices"]
    # switch_tiny: 4 layers, every second a Switch layer of 8 experts
    assert sorted(m) == sorted(f"decoder/layers/{i}/ffn/{w}" for i in range(4)
                               for w in ("wi", "wo"))
    for name, stats in m.items():
        if int(name.split("/")[2]) % 2:
            assert len(stats["experts"]) == 8
            assert stats["nsr_median"] == pytest.approx(
                np.median([e["nsr"] for e in stats["experts"]]))
        else:
            assert stats["noise"] > 0 and stats["nsr"] != 0
    # a scanned run is measured layer by layer: the same matrices and values as unrolled
    assert grad_noise.main(["--workdir", str(trained / "scanned"), "--corpus",
                            str(trained / "corpus"), "--batches", "3", "--json", str(out)]) == 0
    scanned = json.loads(out.read_text())["runs"][0]
    assert grad_noise.summary(scanned) == pytest.approx(grad_noise.summary(run), rel=1e-3)


def test_errors_are_one_line(trained, tmp_path, capsys):
    for argv, words in ((["--workdir", str(tmp_path / "none")], "no config.json"),
                        (["--workdir", str(trained / "switch"), "--batches", "1"],
                         "at least 2 gradients"),
                        (["--workdir", str(trained / "switch"), "--batches", "40"],
                         "not --batches=40")):
        code = grad_noise.main(argv + ["--corpus", str(trained / "corpus")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("error: ") and words in err and "\n" not in err, err
    published = ROOT / "docs" / "grad_noise.json"          # replaced only with --publish
    before = published.read_bytes()
    with pytest.raises(SystemExit, match="published result"):
        grad_noise.main(["--workdir", str(trained / "switch"), "--corpus",
                         str(trained / "corpus"), "--batches", "3", "--json", str(published)])
    assert published.read_bytes() == before
