"""Our safetensors writer, read back by the reference implementation (the safetensors
package), for every dtype we write, bfloat16 included; and our reader on its files."""
import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

from switchzoo import hf, tensorfile

from conftest import Lazy

torch, safetensors_torch = Lazy("torch"), Lazy("safetensors.torch")


def arrays():
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "bf16": rng.standard_normal((4, 2, 3)).astype(ml_dtypes.bfloat16),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "i64": rng.integers(-9, 9, (2, 2)).astype(np.int64),
        "i32": rng.integers(-9, 9, (5,)).astype(np.int32),
        "u8": rng.integers(0, 255, (3,)).astype(np.uint8),
        "bool": rng.integers(0, 2, (4,)).astype(bool),
        "scalar": np.array(2.5, np.float32),
    }


def test_the_safetensors_package_reads_what_we_write(tmp_path):
    ours = arrays()
    tensorfile.write_arrays(tmp_path / "a.safetensors", ours, {"format": "pt"})
    theirs = safetensors_torch.load_file(tmp_path / "a.safetensors")
    assert set(theirs) == set(ours)
    assert theirs["bf16"].dtype == torch.bfloat16
    for name, want in ours.items():
        got = theirs[name]
        got = got.float().numpy() if got.dtype == torch.bfloat16 else got.numpy()
        np.testing.assert_array_equal(got, np.asarray(want, got.dtype), err_msg=name)
    with safetensors.safe_open(tmp_path / "a.safetensors", "np") as f:
        assert f.metadata() == {"format": "pt"}
        np.testing.assert_array_equal(f.get_tensor("f32"), ours["f32"])


def test_we_read_what_the_safetensors_package_writes(tmp_path):
    want = {"x": torch.randn(3, 4, dtype=torch.bfloat16), "y": torch.arange(6).reshape(2, 3)}
    safetensors_torch.save_file(want, tmp_path / "b.safetensors")
    f = tensorfile.TensorFile(tmp_path / "b.safetensors")
    assert f.dtype("x") == np.dtype(ml_dtypes.bfloat16) and f.shape("y") == (2, 3)
    np.testing.assert_array_equal(f.get("x").astype(np.float32), want["x"].float().numpy())
    np.testing.assert_array_equal(f.get("y"), want["y"].numpy())


def test_an_exported_model_reads_back_with_the_safetensors_package(tmp_path):
    import switchzoo
    model = switchzoo.init("switch_base_tiny")
    model.save_pretrained(tmp_path, expert_capacity=64)     # a catalogue model: fixed slots
    theirs = safetensors.numpy.load_file(tmp_path / hf.SINGLE)
    ours = tensorfile.TensorFile(tmp_path / hf.SINGLE)
    assert set(theirs) == set(ours.names())
    for name, value in theirs.items():
        np.testing.assert_array_equal(value, ours.get(name), err_msg=name)
    wi = np.asarray(model.params["decoder"]["layers"][1]["ffn"]["wi"])
    np.testing.assert_array_equal(theirs["decoder.block.1.layer.2.mlp.experts.expert_3.wi.weight"],
                                  wi[3].T)


def test_unsupported_dtype_is_refused():
    with pytest.raises(tensorfile.TensorFileError, match="no safetensors code"):
        tensorfile.write_arrays("/nonexistent/x.safetensors", {"c": np.zeros(2, np.complex64)})
