"""WorkerExtension: what opdflow adds to each vLLM worker (vLLM's worker_extension_cls).

vLLM loads this class by name into every worker process and mixes it into the worker, so
VLLMEngine reaches it through `collective_rpc`: in-place weight reload by name (from
zero-copy views of the object-store buffer, of the engine's shared copy of it when the
worker is a spawned tensor-parallel process, or of the buckets the worker receives on its
own collective pair with the learner; vLLM's loaders keep each worker's shard), and the
fp8_kv amax scales (recipes.py: the torch emulation's rule, which vLLM has no option for).
Nothing here imports vllm.
"""

from __future__ import annotations

from typing import Any


def _fp8_attention_layers(model: Any) -> list[tuple[str, Any]]:
    """vLLM's attention layers that write an FP8 KV cache (skipped layers stay "auto")."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if hasattr(m, "_k_scale_float") and str(getattr(m, "kv_cache_dtype", "")).startswith("fp8")
    ]


def _set_kv_scales(layer: Any, k_scale: float, v_scale: float) -> None:
    """Every copy of a layer's k/v scale vLLM's backends read (tensor, float, host copy)."""
    for kind, value in (("k", k_scale), ("v", v_scale)):
        getattr(layer, f"_{kind}_scale").fill_(value)
        setattr(layer, f"_{kind}_scale_float", value)
        host = getattr(layer, f"_{kind}_scale_cpu", None)
        if host is not None:
            host.fill_(value)


class WorkerExtension:
    """Mixed into vLLM's worker (worker_extension_cls): in-place weight reload by name, and
    the fp8_kv amax scales (recipes.py: the torch emulation's rule, which vLLM lacks)."""

    def opdflow_reload(self, named_tensors: list[tuple[str, Any]]) -> None:
        self.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)  # type: ignore[attr-defined]

    def opdflow_reload_shared(self, path: str, specs: tuple, nbytes: int) -> None:
        """Reload from the engine's shared copy of a version (weights/segment.py), mapped
        zero-copy once per segment; vLLM's loaders take this worker's shard of each."""
        from opdflow.weights.segment import attach
        from opdflow.weights.version import PackedWeights, views

        maps = self.__dict__.setdefault("opdflow_segments", {})
        if path not in maps:
            maps.clear()  # the previous segment's mapping goes
            maps[path] = attach(path, nbytes)
        named = views(PackedWeights(-1, tuple(specs), maps[path])).items()
        self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)  # type: ignore[attr-defined]

    def opdflow_pair_owner(self) -> str:
        """This worker's id as one end of a collective weights pair (weights/pair.py)."""
        from opdflow.weights.pair import process_id

        return process_id()

    def opdflow_join(
        self, address: str, keys: dict[str, str], backend: str, timeout_s: float, host: str
    ) -> None:
        """Open this worker's pair with the learner (on its own device for NCCL)."""
        from opdflow.weights.pair import PairEnd, process_id

        device = getattr(self, "device", "cpu")
        key = keys[process_id()]
        self.opdflow_end = PairEnd(address, key, backend, device, timeout_s, host)

    def opdflow_receive(self, version: int, specs: tuple, nbytes: int, bucket_bytes: int) -> None:
        """Receive a version on this worker's pair bucket by bucket, handing vLLM's reload
        path each tensor once whole (each bucket freed once nothing views it)."""
        from opdflow.weights.bucket import receive_tensors

        self.opdflow_end.expect(version, nbytes, bucket_bytes)
        named = receive_tensors(self.opdflow_end, tuple(specs), nbytes, bucket_bytes)
        self.reload_weights(weights_iterator=named, is_checkpoint_format=True)  # type: ignore[attr-defined]

    def opdflow_install_kv_amax(self) -> int:
        """Pre-hooks on the FP8 attention layers: while armed, a layer's first forward sets
        its k/v scales to amax / 448 of the keys/values it is about to write (the prefill),
        then disarms; later steps keep them. Returns how many layers got a hook."""
        from opdflow.engines.fakequant import E4M3_MAX

        self.opdflow_armed: set[str] = set()

        def hook(name: str):
            def pre(layer: Any, args: tuple, kwargs: dict) -> None:
                if name not in self.opdflow_armed:
                    return
                self.opdflow_armed.discard(name)
                key = kwargs.get("key", args[1] if len(args) > 1 else None)
                value = kwargs.get("value", args[2] if len(args) > 2 else None)
                scales = [float(t.detach().abs().amax()) / E4M3_MAX for t in (key, value)]
                _set_kv_scales(layer, *(s if s > 0 else 1.0 for s in scales))

            return pre

        layers = _fp8_attention_layers(self.get_model())  # type: ignore[attr-defined]
        for name, layer in layers:
            layer.register_forward_pre_hook(hook(name), with_kwargs=True)
        return len(layers)

    def opdflow_arm_kv_amax(self) -> None:
        """The next forward of each FP8 attention layer sets its scales (a new generation)."""
        self.opdflow_armed = {name for name, _ in _fp8_attention_layers(self.get_model())}  # type: ignore[attr-defined]

    def opdflow_kv_scales(self) -> dict[str, tuple[float, float]]:
        """(k_scale, v_scale) of each FP8 attention layer, as the kernels read them."""
        return {
            name: (float(layer._k_scale_float), float(layer._v_scale_float))
            for name, layer in _fp8_attention_layers(self.get_model())  # type: ignore[attr-defined]
        }
