import pytest
import torch

from opdflow.weights.store import WeightStore
from opdflow.weights.version import ALIGN, WeightsRef, pack, views


def test_pack_and_views_round_trip_keeps_dtype_shape_and_bits():
    state = {
        "a": torch.randn(3, 4, dtype=torch.bfloat16),
        "b": torch.arange(5, dtype=torch.float32),
        "c": torch.randn(2, 2, 2),
    }
    packed = pack(state, version=7)
    assert packed.version == 7
    assert packed.nbytes == 3 * ALIGN  # each tensor starts on an aligned offset
    out = views(packed)
    for k, v in state.items():
        assert out[k].dtype == v.dtype
        assert torch.equal(out[k], v)


def test_weight_store_releases_old_versions():
    store = WeightStore()
    for v in range(5):
        store.publish(WeightsRef(v, f"ref{v}", 8))
    assert store.latest == 4
    store.release_below(3)
    assert store.live_versions() == [3, 4]
    assert store.released == 3


def test_weight_store_counts_the_bytes_its_live_versions_pin():
    store = WeightStore()
    for v in range(4):
        store.publish(WeightsRef(v, f"ref{v}", 1000))
    assert store.bytes_live() == 4000
    store.release_below(2)
    assert store.bytes_live() == 2000 == len(store.live_versions()) * 1000
    store.publish(WeightsRef(4, "ref4", 1000))
    assert store.bytes_live() == 3000
    assert (store.peak_live, store.peak_bytes) == (4, 4000)


def test_a_version_never_released_breaks_the_bound():
    import pytest

    from opdflow.config import StalenessConfig
    from opdflow.core.policy import make_policy

    store = WeightStore()
    bound = make_policy(StalenessConfig(k=0)).live_versions  # test_staleness: k_max + 2
    for v in range(bound):
        store.publish(WeightsRef(v, f"ref{v}", 10))
        store.check_bound(bound)
    store.publish(WeightsRef(bound, "leak", 10))  # release_below never called
    with pytest.raises(RuntimeError, match=r"3 weight versions are held \(\[0, 1, 2\]"):
        store.check_bound(bound)
    store.release_below(bound)
    store.check_bound(bound)


def _module(dtype=torch.bfloat16, tied=False):
    m = torch.nn.Module()
    m.a = torch.nn.Linear(8, 16).to(dtype)
    m.b = torch.nn.Linear(16, 8, bias=False).to(dtype)
    if tied:
        m.c = torch.nn.Linear(16, 8, bias=False).to(dtype)
        m.c.weight = m.b.weight
    m.register_buffer("scale", torch.arange(4, dtype=dtype))
    return m


def _bits(m):
    return {
        k: v.detach().to(torch.bfloat16).view(torch.int16).clone()
        for k, v in m.state_dict().items()
    }


def test_views_are_zero_copy_even_of_a_read_only_buffer():
    packed = pack({k: v.detach() for k, v in _module().state_dict().items()}, 3)
    packed.buffer.setflags(write=False)  # as a get from the object store hands it out
    out = views(packed)
    lo = packed.buffer.ctypes.data
    for spec in packed.specs:
        assert out[spec.name].data_ptr() == lo + spec.offset
    assert out.packed is packed


def test_load_module_lays_a_module_out_like_the_version_then_copies_it_whole():
    from opdflow.weights.loader import FlatLayout, load_module

    for tied in (False, True):
        src, dst = _module(tied=tied), _module(tied=tied)
        for version in (1, 2):  # the first load re-homes, the second copies into the layout
            torch.nn.init.normal_(src.a.weight)
            packed = pack({k: v.detach() for k, v in src.state_dict().items()}, version)
            load_module(dst, views(packed))
            flat = dst.__dict__["_opdflow_flat"]
            assert isinstance(flat, FlatLayout) and flat.intact(dst)
            lo = flat.buffer.data_ptr()
            for spec in packed.specs[:1]:
                assert dst.state_dict()[spec.name].data_ptr() == lo + spec.offset
            assert all(torch.equal(a, b) for a, b in zip(_bits(src).values(), _bits(dst).values()))
            assert dst.c.weight is dst.b.weight if tied else True
        y = dst.a(torch.ones(2, 8, dtype=torch.bfloat16))  # the module still computes
        assert torch.equal(y, src.a(torch.ones(2, 8, dtype=torch.bfloat16)))


def test_load_module_falls_back_per_tensor_and_stays_strict():
    from opdflow.weights.loader import load_module

    src, wide = _module(), _module(torch.float32)  # an engine computing in float32
    load_module(wide, views(pack({k: v.detach() for k, v in src.state_dict().items()}, 1)))
    assert "_opdflow_flat" not in wide.__dict__
    assert all(torch.equal(a, b) for a, b in zip(_bits(src).values(), _bits(wide).values()))
    partial = {k: v for k, v in src.state_dict().items() if k != "scale"}
    with pytest.raises(KeyError, match="lack 1"):
        load_module(_module(), partial)
    with pytest.raises(KeyError, match="'extra'"):
        load_module(_module(), {**src.state_dict(), "extra": torch.zeros(1)})
