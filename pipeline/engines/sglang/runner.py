"""SGLang's model runner in this process: the one place that touches SGLang internals (pinned to SGLang 0.5.23).

The recipe is SGLang's own in-process one (`sglang.benchmark.one_batch`, which SpecForge's target backend also
follows): publish the server args as the process's runtime context, load a `ModelRunner` (the object the serving
scheduler drives), then run extend (prefill) batches built exactly as the scheduler builds them. What differs from
serving is only what happens to the result: `LogitsProcessorOutput.hidden_states` (the packed eagle3 aux states,
[tokens, H*k]) and `.last_hidden_states` (the post-norm states the LM head reads) stay tensors here, instead of being
turned into Python lists for a response (why: `pipeline.engines.sglang.adapter`; bench/README.md#sglang_throughput).
"""
from __future__ import annotations

import dataclasses
import os
import socket
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch


@dataclass(frozen=True, kw_only=True)
class RunnerSettings:
    model_path: str
    dtype: str  # "auto" or a torch dtype name
    device: str  # "cpu" or "cuda"
    aux_layer_ids: list[int]  # passed to SGLang verbatim; empty: no aux capture
    max_tokens_per_forward: int  # the KV pool holds one forward's tokens; it is cleared after each forward
    mem_fraction_static: float
    attention_backend: str | None  # None: SGLang's own choice
    tp_size: int = 1
    nccl_port: int | None = None  # torch.distributed rendezvous of the TP ranks (127.0.0.1)
    random_seed: int = 0
    log_level: str = "warning"
    trust_remote_code: bool = False  # model.trust_remote_code (SGLang then follows config.json's auto_map)


@dataclass(frozen=True, kw_only=True)
class ForwardResult:
    """One extend forward over a batch of requests, in request order."""

    input_ids_T: torch.Tensor  # int64 [T]: the token ids the model consumed, all requests concatenated
    lengths: list[int]  # tokens per request, as the forward batch counted them
    aux_TKH: torch.Tensor | None  # [T, k, H]: the k aux captures, in ascending layer order
    post_norm_TH: torch.Tensor  # [T, H]: the final norm's output


def server_args(settings: RunnerSettings):
    from sglang.srt.server_args import ServerArgs

    capture: dict[str, Any] = {"enable_return_hidden_states": True}
    if settings.aux_layer_ids:
        capture = {"enable_return_aux_hidden_states": True, "speculative_algorithm": "EAGLE3",
                   "return_aux_hidden_state_layer_ids": list(settings.aux_layer_ids)}
    backend = {"attention_backend": settings.attention_backend} if settings.attention_backend else {}
    return ServerArgs(
        model_path=settings.model_path, device=settings.device, dtype=settings.dtype, tp_size=settings.tp_size,
        nccl_port=settings.nccl_port,
        disable_radix_cache=True,  # a cached prefix gets no hidden states
        disable_cuda_graph=True,  # extend (prefill) only: decode graphs would never run
        max_total_tokens=settings.max_tokens_per_forward, mem_fraction_static=settings.mem_fraction_static,
        skip_tokenizer_init=True, random_seed=settings.random_seed, log_level=settings.log_level,
        trust_remote_code=settings.trust_remote_code,
        **backend, **capture)


def free_port() -> int:
    """The TP ranks' rendezvous port. Rank 0 binds it only after spawning the followers and resolving its args, so it
    is taken below the kernel's ephemeral range, as SGLang's own PortArgs.init_new takes its nccl_port (an ephemeral
    port can be handed to an outgoing connection meanwhile)."""
    try:
        from sglang.srt.utils.network import get_free_port_below_ephemeral
    except ImportError:  # another SGLang layout: any free port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    return get_free_port_below_ephemeral()


class ModelRunnerSession:
    """A loaded SGLang `ModelRunner` (one TP rank) and the extend forward that captures.

    With TP > 1, rank 0 (this object in the engine's worker) starts ranks 1.. in processes of their own
    (`pipeline.engines.sglang.tp`) and sends them every batch first: all ranks run each forward together, as
    `sglang.benchmark.one_batch` runs them; only rank 0's results are used.
    """

    def __init__(self, settings: RunnerSettings, tp_rank: int = 0,
                 start_followers: Callable[[RunnerSettings], Any] | None = None) -> None:
        """`start_followers(settings)` starts ranks 1.. (rank 0 with TP > 1: `pipeline.engines.sglang.tp.Followers`)."""
        if settings.tp_size > 1 and settings.nccl_port is None:
            settings = dataclasses.replace(settings, nccl_port=free_port())
        self.settings, self.tp_rank = settings, tp_rank
        self._start_followers = start_followers
        self.args = server_args(settings)
        self.runner = None
        self.followers = None

    def start(self) -> None:
        from sglang.benchmark import one_batch
        from sglang.srt.entrypoints.engine import _set_envs_and_config
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
        from sglang.srt.server_args import PortArgs

        rank = self.tp_rank
        if self._start_followers is not None:
            self.followers = self._start_followers(self.settings)  # they join torch.distributed while rank 0 loads
        self.args.resolve_once()
        _set_envs_and_config(self.args)
        port_args = PortArgs.init_new(self.args)
        publish(self.args, role="scheduler",
                ranks=SpawnRanks(world_rank=spawn_world_rank(self.args, tp_rank=rank, pp_rank=0), gpu_id=rank))
        one_batch._init_process_global_configs()
        wrapped, _tokenizer = one_batch.load_model(self.args, port_args, gpu_id=rank, tp_rank=rank)
        self.runner = wrapped.torch_runner
        if self.followers is not None:
            self.followers.wait("start")

    def _requests(self, seqs: Sequence[np.ndarray]) -> list:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        reqs = []
        for i, ids in enumerate(seqs):
            req = Req(rid=str(i), origin_input_text="", origin_input_ids=array("q", ids.tolist()),
                      sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
            req.full_untruncated_fill_ids = req.origin_input_ids
            req.logprob_start_len = -1  # no input logprobs
            req.extend_end = len(req.origin_input_ids)
            reqs.append(req)
        return reqs

    def _forward_batch(self, reqs: list):
        """Built as `sglang.benchmark.one_batch.extend` builds it, with full-sequence hidden-state capture."""
        from sglang.benchmark import one_batch
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
        )
        from sglang.srt.runtime_context import get_schedule
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        mr = self.runner
        tree_cache = one_batch.TreeCacheNamespace(page_size=get_schedule().page_size, device=mr.device,
                                                  token_to_kv_pool_allocator=mr.token_to_kv_pool_allocator)
        batch = ScheduleBatch.init_new(reqs=reqs, req_to_token_pool=mr.req_to_token_pool,
                                       token_to_kv_pool_allocator=mr.token_to_kv_pool_allocator,
                                       tree_cache=tree_cache, model_config=mr.model_config, enable_overlap=False,
                                       spec_algorithm=SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        one_batch._maybe_prepare_mlp_sync_batch(batch, mr)
        if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device, non_blocking=True)
            batch.prefill_input_ids_cpu = None
        return ForwardBatch.init_new(batch, mr, capture_hidden_mode=CaptureHiddenMode.FULL,
                                     return_hidden_states_before_norm=False)

    @torch.inference_mode()
    def forward(self, seqs: Sequence[np.ndarray], *, discard: bool = False) -> ForwardResult | None:
        """Run one extend forward on every rank; `discard` (a follower): run it, copy nothing to the host."""
        if self.followers is None:
            return self._forward(seqs, discard=discard)
        self.followers.send("forward", [np.asarray(ids) for ids in seqs])
        try:
            return self._forward(seqs)
        finally:  # every follower's reply is read, whatever rank 0 did: the next forward reads its own replies
            self.followers.wait("forward")

    def _forward(self, seqs: Sequence[np.ndarray], discard: bool = False) -> ForwardResult | None:
        fb = self._forward_batch(self._requests(seqs))
        try:
            out = self.runner.forward(fb).logits_output
        finally:  # the pools hold this forward's KV only: free them whatever happened
            self.runner.req_to_token_pool.clear()
            self.runner.token_to_kv_pool_allocator.clear()
        if discard:
            return None
        hidden = out.hidden_states.cpu()
        if self.settings.aux_layer_ids:
            # With aux capture, hidden_states holds the packed aux states and last_hidden_states the post-norm ones.
            aux, post_norm = hidden, out.last_hidden_states.cpu()
            k, width = len(self.settings.aux_layer_ids), post_norm.shape[-1]
            if aux.shape[-1] != k * width:  # the seeds' "7168 instead of 3 x 7168": never reshaped into place
                raise RuntimeError(f"SGLang's forward ({type(self.runner.model).__name__}) returned {aux.shape[-1]} "
                                   f"aux values per token for {k} aux layers of width {width}")
            aux = aux.view(aux.shape[0], k, width)
        else:
            aux, post_norm = None, hidden
        return ForwardResult(input_ids_T=fb.input_ids.cpu().to(torch.int64), lengths=list(fb.extend_seq_lens_cpu),
                             aux_TKH=aux, post_norm_TH=post_norm)

    def facts(self) -> dict[str, Any]:
        """What the loaded runner really is (provenance), read from its objects, not from the settings."""
        import sglang
        from sglang.srt.arg_groups.overrides import resolved_view
        from sglang.srt.runtime_context import get_parallel

        mr, parallel = self.runner, get_parallel()
        model = mr.model
        lm = text_model(model)
        capturing = bool(getattr(lm, "capture_aux_hidden_states", False))
        return {
            "sglang_version": sglang.__version__,
            "model_class": type(model).__name__,
            "text_class": type(lm).__name__,  # the class holding the captured layers (the model's own, or inside it)
            "dtype": str(mr.dtype).removeprefix("torch."),
            "device": str(mr.device),
            "attention_backend": f"{resolved_view(self.args).attention_backend} ({type(mr.attn_backend).__name__})",
            "quantization": mr.model_config.quantization,
            "moe": _moe_facts(model, str(mr.device)),
            "parallel": {"tp": parallel.tp_size, "pp": parallel.pp_size},
            "layers_to_capture": list(lm.model.layers_to_capture) if capturing else [],
            "kv_pool_tokens": int(mr.max_total_num_tokens),
            "hidden_size": int(mr.model_config.hidden_size),
        }

    def close(self) -> None:
        if self.followers is not None:
            self.followers.close()
            self.followers = None
        if self.runner is None:
            return
        from sglang.srt.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        self.runner = None
        destroy_model_parallel()
        destroy_distributed_environment()


def text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM whose decoder layers are captured: the model itself, or the language model inside a multimodal
    wrapper (Kimi-K2.5's KimiK25ForConditionalGeneration delegates the eagle3 capture to `language_model`, and the
    capture flag and `layers_to_capture` live there, not on the wrapper)."""
    inner = getattr(model, "language_model", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def _moe_facts(model: torch.nn.Module, device: str) -> dict[str, Any] | None:
    """The MoE quantization method and kernel of the first MoE layer (all MoE layers share one config)."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is None or "MoE" not in type(method).__name__:
            continue
        backend = getattr(getattr(getattr(method, "runner", None), "runner_backend", None), "value", None)
        if device == "cpu":  # the flag SGLang's forward_cpu dispatch reads
            kernel = ("sgl_kernel fused_experts_cpu (AMX)" if getattr(module, "use_intel_amx_backend", False)
                      else "moe_forward_native (PyTorch; no AMX)")
        else:
            kernel = f"MoeRunner backend {backend}"
        return {"layer": type(module).__name__, "method": type(method).__name__, "runner_backend": backend,
                "kernel": kernel}
    return None


def set_platform_env(device: str) -> None:
    """SGLang reads its CPU switch at import time: set it before the first sglang import of this process."""
    if device == "cpu":
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
