"""Runs inside vLLM's worker (`worker_extension_cls`): forward hooks that record the residual stream per request.

vLLM mixes `CaptureExtension` into its worker class; the adapter (`pipeline.engines.vllm`) drives it through
`LLM.collective_rpc("capture_<method>", ...)`. Every model step is recorded as one `_Step`: the request order and
`query_start_loc` the runner used for that step, the token ids and positions the model really received, and one
[tokens, P, H] host buffer that each point's hook copies its states into (the one copy a capture needs: the model
reuses its activations). `capture_take` cuts the steps per request, as views of that buffer, and joins chunked
prefills by position, so a request's states come back whole and in order whatever vLLM's scheduler did. No per-point
clone and no per-request stack: at Kimi's width each such copy is 72 KB per token of host memory traffic.

Hook points (vLLM decoder layers return `(hidden, residual)`, and the residual stream is their sum):
- b0: pre-hook on layer 0, its `hidden_states` argument (the embedding output);
- bk, k >= 1: forward hook on layer k-1, `hidden + residual`;
- final_norm: forward hook on the model's final norm, its first output (what the LM head reads).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.engines.vllm import facts as vllm_facts

EMBED, LAYER_OUT, FINAL_NORM = "embed", "layer_out", "final_norm"


def _own(t: torch.Tensor) -> torch.Tensor:  # the step's token ids and positions (small)
    # Activations are reused or updated in place (fused add+norm), and `.cpu()` of a CPU tensor is the same tensor.
    return t.detach().clone() if t.device.type == "cpu" else t.detach().cpu()


@dataclass
class _Step:
    req_ids: list[str]
    query_start_loc: list[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    states: torch.Tensor | None = None  # [tokens, P, H] on the host, made by the step's first record
    recorded: set[int] = field(default_factory=set)  # point indices written into `states`


def _language_model(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM itself, or a multimodal model's language model (Kimi-K2.5: DeepseekV2ForCausalLM inside)."""
    return model.get_language_model() if hasattr(model, "get_language_model") else model


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (`.layers`, `.norm`) of a causal LM, or of a multimodal model's language model."""
    inner = getattr(_language_model(model), "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise TypeError(f"{type(model).__name__}: no decoder with .layers and .norm found; capture hooks need one")
    return inner


def _kwarg(args: tuple, kwargs: dict, name: str, index: int) -> Any:
    return kwargs[name] if name in kwargs else args[index]


def _step_input_ids(runner: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """The token ids of this step. A multimodal model with multimodal inputs enabled is called with
    `input_ids=None` and `inputs_embeds`: the ids are then read from the runner's own input buffer, which it fills
    for every step either way."""
    ids = kwargs["input_ids"] if "input_ids" in kwargs else (args[0] if args else None)
    return ids if ids is not None else runner.input_ids.cpu

class CaptureExtension:
    """Methods added to vLLM's worker; every name starts with `capture_` so none clashes with the worker's own."""

    def capture_install(self, plan: list[list]) -> dict[str, Any]:
        """Hooks for `plan` = [[kind, layer index or None], ...] in point order; returns what the model looks like."""
        self.capture_remove()
        model = self.model_runner.get_model()
        decoder = _decoder(model)
        self._cap_steps: list[_Step] = []
        self._cap_error: str | None = None
        self._cap_armed = False
        handles = [model.register_forward_pre_hook(self._cap_on_model, with_kwargs=True)]
        for index, (kind, layer) in enumerate(plan):
            handles.append(self._cap_hook(decoder, index, kind, layer))
        self._cap_handles = handles
        self._cap_num_points = len(plan)
        return {"model_class": type(model).__name__, "text_class": type(_language_model(model)).__name__,
                "decoder_class": type(decoder).__name__,
                "num_layers": len(decoder.layers), "layer_class": type(decoder.layers[0]).__name__,
                "norm_class": type(decoder.norm).__name__}

    def _cap_hook(self, decoder: torch.nn.Module, index: int, kind: str, layer: int | None):
        if kind == EMBED:
            def pre(_m, args, kwargs):
                self._cap_record(index, _kwarg(args, kwargs, "hidden_states", 1))
            return decoder.layers[0].register_forward_pre_hook(pre, with_kwargs=True)
        if kind == LAYER_OUT:
            def post(_m, _args, output):
                if not (isinstance(output, tuple) and len(output) == 2 and output[1] is not None):
                    self._cap_fail(f"layer {layer} returned {type(output).__name__}, not (hidden, residual)")
                    return
                self._cap_record(index, output[0], output[1])
            return decoder.layers[layer].register_forward_hook(post)
        if kind == FINAL_NORM:
            def norm_post(_m, _args, output):
                self._cap_record(index, output[0] if isinstance(output, tuple) else output)
            return decoder.norm.register_forward_hook(norm_post)
        raise ValueError(f"capture plan kind={kind!r} is unknown; known: {EMBED}, {LAYER_OUT}, {FINAL_NORM}")

    def _cap_on_model(self, _module, args, kwargs) -> None:
        """Start of a model step: what the runner laid out (request order, token offsets, ids, positions)."""
        if not self._cap_armed:
            return
        runner = self.model_runner
        num_reqs = runner.input_batch.num_reqs
        qsl = runner.query_start_loc.cpu[: num_reqs + 1].tolist()
        num_tokens = qsl[-1]
        positions = _kwarg(args, kwargs, "positions", 1)
        self._cap_steps.append(_Step(req_ids=list(runner.input_batch.req_ids[:num_reqs]), query_start_loc=qsl,
                                     input_ids=_own(_step_input_ids(runner, args, kwargs)[:num_tokens]),
                                     positions=_own(positions[:num_tokens])))

    def _cap_record(self, index: int, hidden: torch.Tensor, residual: torch.Tensor | None = None) -> None:
        """Copy one point's states (`hidden + residual` when a residual is given) into the step's buffer."""
        if not self._cap_armed or not self._cap_steps:
            return
        step = self._cap_steps[-1]
        num_tokens = step.query_start_loc[-1]
        if hidden.shape[0] < num_tokens:
            self._cap_fail(f"point {index}: hidden states hold {hidden.shape[0]} tokens but the step scheduled "
                           f"{num_tokens} (sequence-parallel shards are not supported)")
            return
        hidden = hidden[:num_tokens].detach()
        if step.states is None:
            step.states = torch.empty(num_tokens, self._cap_num_points, hidden.shape[-1], dtype=hidden.dtype)
        column = step.states[:, index]
        if residual is None:
            column.copy_(hidden)
        elif hidden.device.type == "cpu":  # the sum straight into the buffer
            torch.add(hidden, residual[:num_tokens].detach(), out=column)
        else:  # summed on the device, one copy to the host
            column.copy_(hidden + residual[:num_tokens])
        step.recorded.add(index)

    def _cap_fail(self, message: str) -> None:
        # Raising inside a forward would kill the engine core; the error is reported by capture_take instead.
        self._cap_error = self._cap_error or message

    def capture_arm(self) -> None:
        self._cap_steps, self._cap_error, self._cap_armed = [], None, True

    def capture_take_packed(self, req_ids: list[str], num_points: int) -> bytes:
        """`capture_take` as safetensors bytes ("<request id>/<name>" keys), for an EngineCore in another process:
        vLLM's RPC encoding returns tensors as raw lists unless pickling is allowed, and nothing here unpickles."""
        from safetensors.torch import save

        taken = self.capture_take(req_ids, num_points)
        # clone: the requests' states are views of shared step buffers, which safetensors refuses to save
        return save({f"{rid}/{name}": t.clone() for rid, parts in taken.items() for name, t in parts.items()})

    def capture_take(self, req_ids: list[str], num_points: int) -> dict[str, dict[str, torch.Tensor]]:
        """Per internal request id (as `LLM.enqueue` returns them): `input_ids` [T], `positions` [T],
        `hidden` [T, P, H], joined over steps by position. Ranks other than 0 return nothing (same states)."""
        self._cap_armed = False
        steps, self._cap_steps = self._cap_steps, []
        if self._cap_error:
            raise RuntimeError(f"capture failed inside the vLLM worker: {self._cap_error}")
        if self.rank != 0:
            return {}
        pieces: dict[str, list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]] = {r: [] for r in req_ids}
        for step in steps:
            missing = [i for i in range(num_points) if i not in step.recorded]
            if missing:
                raise RuntimeError(f"a model step recorded no states for point index(es) {missing}")
            for j, rid in enumerate(step.req_ids):
                lo, hi = step.query_start_loc[j], step.query_start_loc[j + 1]
                if rid in pieces and hi > lo:  # rows of the step's buffer: a contiguous view, no copy
                    pieces[rid].append((int(step.positions[lo]), step.input_ids[lo:hi], step.positions[lo:hi],
                                        step.states[lo:hi]))
        return {rid: _join(rid, parts) for rid, parts in pieces.items()}

    def capture_facts(self) -> dict[str, Any]:
        return vllm_facts.collect(self)

    def capture_remove(self) -> None:
        for h in getattr(self, "_cap_handles", []):
            h.remove()
        self._cap_handles, self._cap_steps, self._cap_armed = [], [], False


def _join(rid: str, parts: list) -> dict[str, torch.Tensor]:
    if not parts:
        raise RuntimeError(f"request {rid!r}: no model step computed any of its tokens")
    parts.sort(key=lambda p: p[0])
    out = {"input_ids": torch.cat([p[1] for p in parts]), "positions": torch.cat([p[2] for p in parts]),
           "hidden": torch.cat([p[3] for p in parts]) if len(parts) > 1 else parts[0][3]}
    expected = torch.arange(out["positions"].shape[0], dtype=out["positions"].dtype)
    if not torch.equal(out["positions"], expected):
        raise RuntimeError(f"request {rid!r}: captured positions are not 0..{expected.shape[0] - 1} in order "
                           f"(got {out['positions'][:8].tolist()}...): a chunk is missing or duplicated")
    return out
