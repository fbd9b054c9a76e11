import torch

from opdflow.weights import WeightStore, pack, unpack


def test_pack_unpack_round_trip_keeps_dtype_shape_and_bits():
    state = {
        "a": torch.randn(3, 4, dtype=torch.bfloat16),
        "b": torch.arange(5, dtype=torch.float32),
        "c": torch.randn(2, 2, 2),
    }
    packed = pack(state, version=7)
    assert packed.version == 7
    assert packed.nbytes == 3 * 4 * 2 + 5 * 4 + 8 * 4
    out = unpack(packed)
    for k, v in state.items():
        assert out[k].dtype == v.dtype
        assert torch.equal(out[k], v)


def test_weight_store_releases_old_versions():
    store = WeightStore()
    for v in range(5):
        store.publish(v, f"ref{v}", nbytes=8)
    assert store.latest == 4
    store.release_below(3)
    assert store.live_versions() == [3, 4]
    assert store.released == 3


def test_weight_store_counts_the_bytes_its_live_versions_pin():
    store = WeightStore()
    for v in range(4):
        store.publish(v, f"ref{v}", nbytes=1000)
    assert store.bytes_live() == 4000
    store.release_below(2)
    assert store.bytes_live() == 2000 == len(store.live_versions()) * 1000
    store.publish(4, "ref4", nbytes=1000)
    assert store.bytes_live() == 3000
    assert (store.peak_live, store.peak_bytes) == (4, 4000)


def test_a_version_never_released_breaks_the_bound():
    import pytest

    from opdflow.config import StalenessConfig
    from opdflow.weights import live_bound

    assert live_bound(StalenessConfig(k=2)) == 4
    assert live_bound(StalenessConfig(policy="adaptive", k=0, k_max=8)) == 10
    store = WeightStore()
    bound = live_bound(StalenessConfig(k=0))
    for v in range(bound):
        store.publish(v, f"ref{v}", nbytes=10)
        store.check_bound(bound)
    store.publish(bound, "leak", nbytes=10)  # release_below never called
    with pytest.raises(RuntimeError, match=r"3 weight versions are held \(\[0, 1, 2\]"):
        store.check_bound(bound)
    store.release_below(bound)
    store.check_bound(bound)
