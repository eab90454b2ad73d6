"""Hugging Face transformers: the reference engine.

Boundaries 0..N-1 come from `output_hidden_states` (index k = residual stream after k layers). The last layer's output
(bN) and the final norm's output are taken from a forward hook on the model's final norm (its input and its output),
so neither depends on how a given transformers version fills the last `hidden_states` index.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.contracts import (CPU_THREADS, Capture, EngineInfo, Generation, GenerationRequest, PointSource,
                                     PreparedSample)
from pipeline.engines.base import Engine
from pipeline.engines.hf_options import HFOptions
from pipeline.models.hf_text import load_text_model

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _device(asked: str) -> torch.device:
    """The device `engine.options.device` names, on this host; a CUDA device that is not here is refused by name."""
    if asked == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(asked)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise RuntimeError(f"engine.options.device={asked!r}: this host has {count} CUDA device(s) (torch "
                               f"{torch.__version__}); use device=cpu or auto")
    return device


class HFEngine(Engine):
    name = "hf"
    options_type = HFOptions
    opts: HFOptions

    def start(self) -> None:
        import transformers

        dtype: Any = "auto" if self.dtype == "auto" else _DTYPES[self.dtype]
        self._device = _device(self.opts.device)  # before any weight is read: a device that is not here stops it
        # A multimodal wrapper (Kimi-K2.5) loads as the text model inside it: pipeline.models.hf_text.
        self.model, self._layout = load_text_model(
            self.model_path, trust_remote_code=self.trust_remote_code, dtype=dtype,
            attn_implementation=self.opts.attn_implementation)
        self.model.eval()
        self._loaded_dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in self.model.parameters()})
        if dtype != "auto":
            # transformers 5.19 leaves compressed-tensors experts dequantized in bf16 even when asked for float32
            # (and model.float() refuses quantized models), so one forward would mix dtypes: cast every parameter.
            for param in self.model.parameters():
                if param.is_floating_point() and param.dtype != dtype:
                    param.data = param.data.to(dtype)
        self.model.to(self._device)
        self._norm = self.model.get_decoder().norm
        self._pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        self._versions = {"transformers": transformers.__version__, "torch": torch.__version__}
        n = self.model.config.get_text_config().num_hidden_layers
        if n != self.num_layers:
            raise ValueError(f"model.path={self.model_path!r}: loaded model has {n} layers, config said "
                             f"{self.num_layers}")

    def _forward(self, samples: Sequence[PreparedSample]) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        lengths = [s.num_tokens for s in samples]
        ids = torch.full((len(samples), max(lengths)), self._pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(samples):
            ids[i, : lengths[i]] = torch.from_numpy(s.input_ids_T.astype(np.int64))
            mask[i, : lengths[i]] = 1
        seen: dict[str, torch.Tensor] = {}

        def hook(_module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
            seen["pre_norm"], seen["post_norm"] = args[0], output

        ids, mask = ids.to(self._device), mask.to(self._device)
        handle = self._norm.register_forward_hook(hook)
        try:
            with torch.inference_mode():
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=self._position_ids(mask),
                                 output_hidden_states=True, use_cache=False, logits_to_keep=1)
        finally:
            handle.remove()
        return out.hidden_states, seen

    def _position_ids(self, mask: torch.Tensor) -> torch.Tensor | None:
        """None: the model numbers positions itself (0.. per right-padded row). Engines built on this one override it."""
        return None

    def _select(self, hidden: tuple[torch.Tensor, ...], normed: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, T, P, H] in request order."""
        picked = []
        for p in self.points:
            if p.is_final_norm:
                picked.append(normed["post_norm"])
            elif p.boundary == self.num_layers:
                picked.append(normed["pre_norm"])
            else:
                picked.append(hidden[p.boundary])
        return torch.stack(picked, dim=2)

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        hidden, normed = self._forward(samples)
        stacked = self._select(hidden, normed).cpu()  # host memory, in the dtype captured (no copy on a CPU)
        return [
            Capture(sample_id=s.sample_id, input_ids_T=s.input_ids_T.astype(np.int64),
                    hidden_states_TPH=stacked[i, : s.num_tokens].clone())
            for i, s in enumerate(samples)
        ]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One request at a time (the slow reference: no padding, so no batch can change a request's ids)."""
        return [self._generate_one(r) for r in requests]

    def _generate_one(self, request: GenerationRequest) -> Generation:
        import transformers

        s = request.sampling
        config = transformers.GenerationConfig.from_dict(
            {**self.model.generation_config.to_dict(), "max_new_tokens": s.max_tokens,
             "do_sample": s.temperature > 0, "temperature": s.temperature or 1.0, "top_p": s.top_p,
             "top_k": s.top_k or None, "eos_token_id": list(s.stop_token_ids) or None,
             "pad_token_id": self._pad_id, "max_length": None})
        if s.temperature > 0:
            torch.manual_seed(s.seed if s.seed is not None else 0)  # transformers samples from torch's global RNG
        ids = torch.tensor([list(request.prompt_ids)], dtype=torch.long, device=self._device)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        output = out[0, ids.shape[1]:].tolist()
        stopped = bool(output) and output[-1] in s.stop_token_ids
        applied = {key: getattr(config, key) for key in ("do_sample", "temperature", "top_p", "top_k", "min_p",
                                                          "repetition_penalty", "max_new_tokens", "eos_token_id")}
        applied.update(seed=s.seed if s.temperature > 0 else None, rng="torch global generator, seeded per request")
        return Generation(request_id=request.request_id, output_ids=tuple(output),
                          finish_reason="stop" if stopped else "length", applied=applied)

    def _point_sources(self) -> list[PointSource]:
        sources = []
        for p in self.points:
            if p.is_final_norm:
                sources.append(PointSource(point=p.label, native_id=self.num_layers,
                                           method="forward hook: output of model.norm (= output_hidden_states[N])"))
            elif p.boundary == self.num_layers:
                sources.append(PointSource(point=p.label, native_id=None,
                                           method="forward hook: input of model.norm (last layer output)"))
            else:
                sources.append(PointSource(point=p.label, native_id=p.boundary,
                                           method=f"output_hidden_states[{p.boundary}]"))
        return sources

    def _quantization(self) -> dict[str, Any]:
        qc = getattr(self.model.config, "quantization_config", None)
        if qc is None:
            return {"method": None, "kernel": "dense", "dequantized_at_load": False}
        qc = qc if isinstance(qc, dict) else qc.to_dict()
        packed = [n for n, _ in self.model.named_parameters() if n.endswith("weight_packed")]
        return {
            "method": qc.get("quant_method"),
            "format": qc.get("format"),
            "kernel": "compressed-tensors packed weights" if packed else
                      f"none: dequantized at load (parameter dtypes after load: {', '.join(self._loaded_dtypes)}), "
                      f"dense matmuls in {str(self.model.dtype).removeprefix('torch.')}",
            "dequantized_at_load": not packed,
        }

    def info(self) -> EngineInfo:
        return EngineInfo(
            framework="transformers",
            framework_version=self._versions["transformers"],
            dtype=str(self.model.dtype).removeprefix("torch."),
            quantization=self._quantization(),
            attention_backend=str(self.model.config._attn_implementation),
            parallel={"tp": 1, "pp": 1, "dp": 1},
            libraries=self._versions,
            points=self._point_sources(),
            extra={"model_class": type(self.model).__name__, "wrapper_class": self._layout.wrapper_class,
                   "text_class": self._layout.text_class, "trust_remote_code": self.trust_remote_code,
                   "mla_norm_eps_set_to_config": self._layout.mla_norm_eps,
                   "device": str(self.model.device), **self._cpu_threads()},
        )

    def _cpu_threads(self) -> dict[str, int]:
        """On CPU, the intra-op threads the forward runs on: bf16 kernels reduce in another order on another count,
        so they change the bits (on a GPU they do not, and are not recorded)."""
        return {CPU_THREADS: torch.get_num_threads()} if self.model.device.type == "cpu" else {}

    def close(self) -> None:
        self.__dict__.pop("model", None)
        self.__dict__.pop("_norm", None)
