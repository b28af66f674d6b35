"""Mesh specs, layout strings, presets, and the errors they give."""
import jax
import pytest
from jax.sharding import PartitionSpec as P

from switchzoo import layout as L


def test_mesh_spec_parses_and_fills_minus_one():
    assert L.parse_mesh("data:2,model:2,expert:2", 8) == L.MeshSpec(("data", "model", "expert"),
                                                                    (2, 2, 2))
    assert L.parse_mesh("data:-1,model:2", 8).shape == (4, 2)
    assert L.parse_mesh("m0:2,m1:4", 8).axes == ("m0", "m1")
    mesh = L.make_mesh("data:2,model:2,expert:2")
    assert dict(mesh.shape) == {"data": 2, "model": 2, "expert": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    one = L.make_mesh("data:1", devices=jax.devices()[:1])
    assert one.size == 1


@pytest.mark.parametrize("spec, message", [
    ("data2,model:4", r"entry 'data2' is not 'axis:size'"),
    ("data:two", r"size 'two' of axis 'data' is not an integer"),
    ("data:0,model:8", r"axis 'data' has size 0"),
    ("data:-1,model:-1", r"more than one axis is -1"),
    ("data:2,data:4", r"axis 'data' appears twice"),
    ("data:2,model:2", r"has 4 devices but 8 are available"),
    ("data:3,model:-1", r"do not divide the 8 devices"),
    ("", r"is empty"),
])
def test_bad_mesh_specs_name_the_problem(spec, message):
    with pytest.raises(L.LayoutError, match=message):
        L.parse_mesh(spec, 8)


def test_mesh_tensorflow_paper_layouts_work_as_written():
    mesh = L.make_mesh("m0:2,m1:4")
    model_parallel = L.Layout.create("vocab:m0,heads:m0,d_ff:m0", mesh)
    assert model_parallel.spec(("vocab", "d_model"), (256, 64)) == P("m0")
    assert model_parallel.spec(("d_model", "d_ff"), (64, 128)) == P(None, "m0")
    assert model_parallel.spec(("batch", "length", "d_model"), (8, 16, 64), strict=False) == P()
    both = L.Layout.create("batch:m0,vocab:m1,heads:m1,d_ff:m1", mesh)
    assert both.spec(("batch", "length", "d_ff"), (8, 16, 128), strict=False) == P("m0", None, "m1")
    assert both.spec(("d_model", "heads", "d_kv"), (64, 4, 16)) == P(None, "m1")


def test_plus_splits_one_dim_over_several_axes():
    lay = L.Layout.create("batch:data+expert,experts:expert", "data:2,model:2,expert:2")
    assert lay.spec(("batch", "length"), (8, 16)) == P(("data", "expert"))
    # groups follow the batch unless the layout names them.
    assert lay.spec(("groups", "group_size", "d_model"), (8, 4, 2)) == P(("data", "expert"))
    # In an activation the first dim claims an axis; experts then take 'expert' only where free.
    assert lay.spec(("experts", "groups", "expert_capacity", "d_model"), (8, 8, 4, 2),
                    strict=False) == P("expert", "data")


@pytest.mark.parametrize("layout, message", [
    ("batch:data,bach:model", r"unknown dimension 'bach' \(did you mean 'batch'\?\)"),
    ("batch:dta", r"mesh axis 'dta' \(did you mean 'data'\?\), which the mesh does not have"),
    ("batch:data,batch:model", r"dimension 'batch' is laid out twice"),
    ("batch:data+data", r"names a mesh axis twice"),
    ("batch:data,heads", r"entry 'heads' is not 'dim:axis'"),
    ("batch:", r"entry 'batch:' is not 'dim:axis'"),
])
def test_bad_layout_strings_name_the_problem(layout, message):
    with pytest.raises(L.LayoutError, match=message):
        L.Layout.create(layout, "data:2,model:2,expert:2")


def test_unknown_preset_suggests_a_name():
    with pytest.raises(L.LayoutError, match=r"unknown layout preset 'data_paralel' "
                                            r"\(did you mean 'data_parallel'\?\)"):
        L.layout_string("data_paralel")


def test_parameter_errors_name_the_tensor_and_the_fix():
    lay = L.Layout.create("d_model:model,d_ff:model", "data:2,model:4")
    with pytest.raises(L.LayoutError, match=r"layers/0/ffn/wi .*mesh axis 'model' is used by both "
                                            r"'d_model' and 'd_ff'.*map one of them"):
        lay.spec(("d_model", "d_ff"), (64, 128), "layers/0/ffn/wi")
    lay = L.Layout.create("heads:model", "data:2,model:4")
    with pytest.raises(L.LayoutError, match=r"layers/0/attn/q .*'heads' of size 6 is not divisible "
                                            r"by mesh axes model \(4 devices\)"):
        lay.spec(("d_model", "heads", "d_kv"), (64, 6, 16), "layers/0/attn/q")
    with pytest.raises(ValueError, match=r"w: unknown dimension name\(s\) \['hidden'\]"):
        lay.spec(("d_model", "hidden"), (4, 4), "w")
    with pytest.raises(L.LayoutError, match=r"rank 2 but dims"):
        lay.spec(("d_model",), (4, 4), "w")


def test_activations_are_lenient():
    lay = L.Layout.create("batch:data,d_model:data,d_ff:model", "data:4,model:2")
    # Same axis asked twice: the batch keeps it, d_model stays whole.
    assert lay.spec(("batch", "length", "d_model"), (8, 4, 16), strict=False) == P("data")
    # An axis that does not divide the dim is left out rather than failing the trace.
    assert lay.spec(("batch", "length", "d_ff"), (3, 4, 16), strict=False) == P(None, None, "model")


def test_every_preset_loads_on_its_own_mesh():
    presets = L.presets()
    assert {"data_parallel", "model_parallel", "expert_parallel", "dp_ep", "2d",
            "dp_mp_ep"} <= set(presets)
    for preset in presets.values():
        lay = L.Layout.create(preset.name, preset.mesh)
        assert lay.mesh.size == 8 and preset.doc


def test_constrain_is_a_noop_without_a_layout_and_checks_names():
    x = jax.numpy.ones((2, 3))
    assert L.constrain(x, ("batch", "length")) is x
    with pytest.raises(ValueError, match="unknown dimension"):
        L.constrain(x, ("batch", "time"))


def test_lenient_fallback_keeps_every_axis_that_still_divides():
    lay = L.Layout.create("batch:data+expert", "data:4,expert:2")
    assert lay.spec(("batch", "length"), (2, 16), strict=False) == P("expert")
