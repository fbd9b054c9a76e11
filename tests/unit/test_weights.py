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
        store.publish(v, f"ref{v}")
    assert store.latest == 4
    store.release_below(3)
    assert store.live_versions() == [3, 4]
    assert store.released == 3
