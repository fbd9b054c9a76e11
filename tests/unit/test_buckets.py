"""The collective's buckets over gloo, and where the weight path puts its buffers.

- Buckets cover a version in order, and whole tensors come out of them, also the ones that
  straddle bucket boundaries.
- A bucketed transfer (the learner's Publisher and a consumer's pair end, two threads here,
  two actors in a run) delivers, byte for byte, what the object-store path puts: straight
  into a model laid out like the version, as whole tensors (vLLM's reload path) and as a
  whole version. With buckets staged through two buffers as NCCL's are, the sender's
  bucket buffers, counted as they are allocated and freed, never exceed two buckets, also
  with two consumers fetching at once; gloo's own path (staging slices) allocates none.
- Placement, for each transport and device kind (a recording stand-in for a GPU): staging
  is host memory (pinned on the GPU), no object-store publish allocates device memory, and
  the collective's device memory is its two NCCL buckets.
- A released version is refused in the header, so the consumer does not hang.
"""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from support.weight_memory import RecordingMemory

from opdflow.weights.bucket import Unpacker, plan, receive_tensors
from opdflow.weights.cast import BF16Cast, bf16_entries, write_bf16
from opdflow.weights.fetcher import LocalReceiver
from opdflow.weights.loader import FlatLayout, load_module
from opdflow.weights.pair import PairEnd
from opdflow.weights.publisher import Publisher
from opdflow.weights.transport import Collective, ObjectStore
from opdflow.weights.version import ALIGN, PackedWeights, allocate, as_torch, views

BUCKET = 4 * ALIGN * 16  # 4 KiB: the ~70 KB version below moves in ~18 buckets


class Model(torch.nn.Module):
    """A small model whose tensors straddle 4 KiB buckets (and one is larger than one)."""

    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        self.embed = torch.nn.Embedding(97, 48)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(48, 48 + 8 * i) for i in range(3))
        self.head = torch.nn.Linear(64, 97, bias=False)
        self.register_buffer("steps", torch.arange(5))  # not floating: published as is
        self.to(dtype)


def _fp32_state(seed: int) -> dict:
    torch.manual_seed(seed)
    return {k: v.float() if v.is_floating_point() else v for k, v in Model().state_dict().items()}


def _staged(pub: Publisher, cast: BF16Cast, state: dict, version: int):
    packed = pub.buffer(version, bf16_entries(state))
    return packed, cast.start(state, packed)


def _object_store(state: dict):
    """What the object-store path puts for `state`: its publisher's staging after the cast
    (the PackedWeights `seal` hands to ray.put)."""
    pub = Publisher(ObjectStore(), "cpu")
    _, done = _staged(pub, BF16Cast(False), state, 0)
    return done.result()


def _object_store_bytes(state: dict) -> bytes:
    """Every tensor's bytes the object-store path puts for `state`, in manifest order."""
    return _bits(views(_object_store(state)).items())


def _pair(pub: Publisher, key: str) -> PairEnd:
    opened = threading.Thread(target=pub.open_pair, args=(key, key))
    opened.start()
    end = PairEnd(pub.address, key, "gloo", "cpu", 60, "127.0.0.1")
    opened.join()
    return end


def _sending(pub: Publisher, version: int, keys: list[str], errors: list) -> threading.Thread:
    def send():
        try:
            pub.send(version, keys)
        except Exception as exc:  # checked by the test
            errors.append(exc)

    t = threading.Thread(target=send)
    t.start()
    return t


def _bits(named) -> bytes:
    return b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for _, t in named)


def test_buckets_cover_a_version_and_whole_tensors_come_out_of_them():
    packed = allocate(bf16_entries(_fp32_state(0)), 1)
    write_bf16(_fp32_state(0), packed)
    whole = as_torch(packed.buffer)
    expected = [(k, v.view(torch.uint8).flatten()) for k, v in views(packed).items()]
    for bucket in (ALIGN, 3 * ALIGN, BUCKET, 10**6 * ALIGN):
        ranges = plan(packed.nbytes, bucket)
        assert ranges[0][0] == 0 and ranges[-1][1] == packed.nbytes
        assert all(a[1] == b[0] and a[1] - a[0] == bucket for a, b in itertools.pairwise(ranges))
        unpack = Unpacker(packed.specs, "cpu")
        got = [x for s, e in ranges for x in unpack.take(whole[s:e].clone(), s, e)]
        assert [n for n, _ in got] == [n for n, _ in expected]  # in manifest order, each once
        for (name, t), (_, want) in zip(got, expected):
            assert t.dtype == views(packed)[name].dtype
            assert torch.equal(t.contiguous().view(torch.uint8).flatten(), want), (bucket, name)
    with pytest.raises(ValueError, match="multiple of 64"):
        plan(1000, 100)


@pytest.mark.parametrize("buckets", ["staged", "slices"])
def test_a_bucketed_transfer_over_gloo_is_the_object_store_bytes_and_holds_two_buckets(buckets):
    """staged: each bucket copied into one of two buffers before it is sent (NCCL's path,
    here over real gloo sends); slices: gloo's own path, sending staging slices."""
    mem = RecordingMemory(staged=buckets == "staged")
    pub = Publisher(Collective(bucket_bytes=BUCKET, timeout_s=60), "cpu", memory=mem)
    cast = BF16Cast(True, mem)
    states = {v: _fp32_state(v) for v in (1, 2, 3)}
    handles = {}
    for v, state in states.items():
        packed, done = _staged(pub, cast, state, v)
        handles[v] = pub.hold(packed, source=None, cast=done)
    nbytes = handles[1].nbytes
    assert nbytes > 8 * BUCKET  # the bound below is not vacuous
    assert handles[1].backend == "gloo" and pub.held() == [1, 2, 3]

    # 1. straight into a model laid out like the version (a TorchEngine's, the rescorer's)
    model, errors = Model(), []
    receiver = LocalReceiver(lambda named, version: load_module(model, named), "cpu")
    opened = threading.Thread(target=pub.open_pair, args=("k1", "consumer"))
    opened.start()
    receiver.join(str(pub.address), ["k1"], "gloo", 60)
    opened.join()
    for v in (1, 2):
        sender = _sending(pub, v, ["k1"], errors)
        receiver.receive(v, handles[v].specs, nbytes, BUCKET)
        sender.join()
        flat = model.__dict__["_opdflow_flat"]
        assert isinstance(flat, FlatLayout) and flat.intact(model)
        in_model = views(PackedWeights(v, handles[v].specs, flat.buffer)).items()
        assert _bits(in_model) == _object_store_bytes(states[v])
    assert receiver.end._whole is None  # no receive buffer: the buckets went into the model

    # 2. as whole tensors, bucket by bucket (a vLLM worker's reload path), two consumers at
    # once: a second pair receives version 3 while the first does
    ends = {"k1": receiver.end, "k2": _pair(pub, "k2")}
    got: dict[str, bytes] = {}

    def take(key: str) -> None:
        end = ends[key]
        end.expect(3, nbytes, BUCKET)
        got[key] = _bits(receive_tensors(end, handles[3].specs, nbytes, BUCKET))

    takers = [threading.Thread(target=take, args=(k,)) for k in ends]
    for t in takers:
        t.start()
    senders = [_sending(pub, 3, [k], errors) for k in ends]
    for t in takers + senders:
        t.join()
    expected = _object_store_bytes(states[3])
    assert got == {"k1": expected, "k2": expected}

    # 3. a whole version for a reader that takes items (the evaluator's second model)
    read = {}
    receiver.load = lambda named, version: read.update(named)
    sender = _sending(pub, 2, ["k1"], errors)
    receiver.receive(2, handles[2].specs, nbytes, BUCKET)
    sender.join()
    assert _bits(read.items()) == _object_store_bytes(states[2])

    # the sender held two bucket buffers for all of it (or none: slices), never a version
    assert not errors, errors
    if buckets == "staged":
        assert [a.nbytes for a in mem.of("wire")] == [BUCKET, BUCKET]
        assert mem.peak["wire"] <= 2 * BUCKET == pub.sender.held_bytes()
        assert mem.places() == {("host", "pageable"), ("wire", "pageable")}
    else:
        assert mem.of("wire") == [] and pub.sender.held_bytes() == 0
        assert mem.places() == {("host", "pageable")}
    assert mem.peak["host"] == 3 * nbytes  # the three versions held: staging only

    # a released version is refused in the header: the consumer raises, nothing hangs
    assert pub.retain([3]) == [3]
    sender = _sending(pub, 1, ["k1"], errors)
    with pytest.raises(RuntimeError, match="no longer holds it"):
        receiver.receive(1, handles[1].specs, nbytes, BUCKET)
    sender.join()
    assert len(errors) == 1 and "no longer held" in str(errors[0])
    cast.close()


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "gpu-stand-in"])
@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_staging_is_host_memory_and_only_the_collective_buckets_touch_the_device(transport, cuda):
    """Every buffer the learner's publish path allocates, by transport and device kind:
    staging in host memory (pinned on a GPU), whatever the transport; device memory only
    for the collective's two NCCL buckets. The object store's put (`seal`) copies that
    staging into the store and allocates nothing on a device."""
    mem = RecordingMemory(cuda)
    kind = Collective(bucket_bytes=BUCKET) if transport == "collective" else ObjectStore()
    pub = Publisher(kind, "cpu", memory=mem)
    cast = BF16Cast(True, mem)
    assert cast.mode == ("stream" if cuda else "thread")
    state = _fp32_state(0)
    packed, done = _staged(pub, cast, state, 1)
    pub.stage(packed, done)
    done.result()
    cast.settle()
    assert _bits(views(packed).items()) == _object_store_bytes(state)  # cast on either path
    staging = "pinned" if cuda else "pageable"
    assert mem.of("host") == [mem.allocations[0]] and mem.allocations[0].place == staging
    assert mem.allocations[0].nbytes == packed.nbytes
    if transport == "object_store":
        assert pub.sender is None and mem.of("wire") == []  # nothing on the device, ever
        return
    # the sends' buckets (to nobody here): NCCL copies them into two device buffers,
    # gloo sends slices of the host staging (no buffer)
    header = torch.tensor([1, 1, packed.nbytes, BUCKET])
    pub.sender.send([], header, as_torch(packed.buffer))
    if cuda:
        assert [a.place for a in mem.of("wire")] == ["device", "device"]
        assert mem.peak["wire"] == 2 * BUCKET < packed.nbytes
    else:
        assert mem.of("wire") == []
    assert mem.peak["host"] == packed.nbytes  # one version staged, on the host
    cast.close()
