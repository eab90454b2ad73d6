"""SGLang 0.5.23: the primary serving engine, captured through its own model runner in the engine's virtualenv.

How each canonical point is obtained (`pipeline.engines.sglang.plan`): boundaries through SGLang's built-in eagle3
aux capture (`enable_return_aux_hidden_states`, `speculative_algorithm="EAGLE3"`,
`return_aux_hidden_state_layer_ids` from `pipeline.points.to_native`, whose numbering differs between Llama and
DeepSeek); the embedding on Llama from an exact lookup in the checkpoint's table (on DeepSeek from native id 0);
final_norm from the post-norm states the LM head reads. The last layer's pre-norm output cannot be captured and is
refused. After loading, the model's own `layers_to_capture` must equal the boundaries the plan expects, so a wrong
numbering table stops the engine before any capture. Radix cache off; on CPU: `device=cpu`,
`attention_backend=torch_native`, CUDA graphs off, plus `pipeline.engines.sglang.cpu`.

Why the in-process model runner, not `sglang.Engine.generate` (figures: bench/README.md#sglang_throughput):
- `Engine.generate(return_hidden_states=True)` returns hidden states as nested Python lists (the scheduler pickles
  them to the tokenizer manager; the caller rebuilds tensors). With aux capture enabled the response carries the aux
  states *in place of* the post-norm ones, so final_norm needs a second pass. Turning the lists back into tensors
  costs more than the forward, and its cost grows with the width: at Kimi's (7168 x 4 aux floats per token) it alone
  caps a replica's throughput, whatever the GPUs do.
- The in-process runner (`sglang.benchmark.one_batch`'s recipe, which SpecForge's target backend also uses) runs the
  same `ModelRunner.forward` the scheduler runs (the tests show its final states equal `Engine.generate`'s exactly)
  and keeps `LogitsProcessorOutput.hidden_states` (packed aux) and `.last_hidden_states` (post-norm) as tensors from
  one forward: no lists, no second pass.
The generate task (`task="generate"`, the regeneration stage) runs SGLang's real serving path instead,
`sglang.Engine` fed token ids: `pipeline.engines.sglang.generation`.
Tensor parallelism (`engine.tp_size`, GPUs only): this runner is rank 0; ranks 1.. run in processes of their own, in
lockstep (`pipeline.engines.sglang.tp`), as SGLang's own in-process benchmark runs them. Not exercised on the CPU
machines this was built on: SGLang 0.5.23's CPU engine cannot form TP groups (it builds an NCCL communicator on the CPU
device), so TP > 1 on CPU is refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.contracts import Capture, EngineInfo, EngineSpec, Generation, GenerationRequest, PreparedSample
from pipeline.engines.base import Engine, GenerationUnsupported
from pipeline.engines.sglang import cpu as sglang_cpu
from pipeline.engines.sglang.generation import RADIX_CACHE_WHY, GenerationSession, GenerationSettings
from pipeline.engines.sglang.options import SGLangOptions
from pipeline.engines.sglang.plan import AUX, TABLE, CapturePlan, make_plan
from pipeline.engines.sglang.runner import ModelRunnerSession, RunnerSettings, set_platform_env
from pipeline.engines.sglang.table import load_embedding_table, lookup
from pipeline.engines.sglang.tp import Followers
from pipeline.models.info import read_model_info

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def _refuse_quantized_on_cpu(model_path: str, quantization: dict[str, Any] | None) -> None:
    """SGLang 0.5.23 runs no compressed-tensors INT4 scheme on CPU, MoE or dense; a bf16 checkpoint is the honest
    alternative (docs/engines.md#int4-w4a16-dense-on-cpu)."""
    if not quantization:
        return
    path = Path(model_path)
    twin = path.with_name(path.name.replace("int4", "bf16")) if "int4" in path.name else None
    hint = f"model.path={str(twin)!r}, " if twin is not None and twin.is_dir() else ""
    raise ValueError(
        f"model.path={model_path!r}: {quantization.get('quant_method')} ({quantization.get('format', '?')}) "
        f"checkpoint, but SGLang 0.5.23 has no INT4 MoE kernel on CPU: it selects the Marlin WNA16 MoE kernel, "
        f"which is CUDA-only, and its dense WNA16 Linear scheme asks for the CUDA device's capability while loading "
        f"('Found no NVIDIA driver on your system'); nothing is dequantized silently. Capture a bf16 checkpoint "
        f"instead ({hint}model=tiny_kimi_bf16 for the tiny target: the same weights with the INT4 experts "
        f"dequantized; model=smollm2 for the real model's W4A16 twin: the bf16 model it was quantized from), run a "
        f"dense W4A16 checkpoint with engine=hf or engine=vllm in bfloat16, or run engine=sglang on a GPU")


def _refuse_tp_on_cpu(tp: int) -> None:
    if tp > 1:
        raise ValueError(f"engine.tp_size={tp} with engine.options.device=cpu: SGLang 0.5.23's CPU engine builds an "
                         f"NCCL communicator for its TP groups (it fails with 'Expected a cuda device, but got: "
                         f"cpu'), so TP > 1 runs on GPUs only; use engine.tp_size=1 on CPU")


class SGLangEngine(Engine):
    name = "sglang"
    environment = ".venv-sglang"
    options_type = SGLangOptions
    opts: SGLangOptions

    def __init__(self, spec: EngineSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        info = read_model_info(self.model_path)
        if info.num_layers != self.num_layers:
            raise ValueError(f"model.path={self.model_path!r}: config.json has {info.num_layers} layers, the run "
                             f"expects {self.num_layers}")
        self.device = _device(self.opts.device)
        if self.device == "cpu":
            _refuse_quantized_on_cpu(self.model_path, info.quantization)
            _refuse_tp_on_cpu(self.spec.tp_size)
        # Generating captures nothing: no plan, and points given with task="generate" are ignored (a capture
        # config's points, b{N} among them, must not stop a generation the plan would refuse)
        self.plan: CapturePlan | None = None
        if self.task == "capture":
            self.plan = make_plan(self.points, family=info.family, num_layers=self.num_layers,
                                  aux_layer_ids=self.opts.aux_layer_ids)
        self.max_tokens_per_forward = self.opts.max_tokens_per_forward
        self._session = None
        self._table: torch.Tensor | None = None
        self._table_key: str | None = None
        self._compat: dict[str, Any] | None = None
        self._generator: GenerationSession | None = None

    def _settings(self) -> RunnerSettings:
        backend = self.opts.attention_backend or ("torch_native" if self.device == "cpu" else None)
        return RunnerSettings(model_path=self.model_path, dtype=self.dtype, device=self.device,
                              aux_layer_ids=self.plan.aux_layer_ids, max_tokens_per_forward=self.max_tokens_per_forward,
                              mem_fraction_static=self.opts.mem_fraction_static,
                              attention_backend=backend, tp_size=self.spec.tp_size,
                              log_level=self.opts.log_level,
                              trust_remote_code=self.trust_remote_code)

    def _generation_settings(self) -> GenerationSettings:
        backend = self.opts.attention_backend or ("torch_native" if self.device == "cpu" else None)
        return GenerationSettings(model_path=self.model_path, dtype=self.dtype, device=self.device,
                                  attention_backend=backend, kv_pool_tokens=self.max_tokens_per_forward,
                                  mem_fraction_static=self.opts.mem_fraction_static, tp_size=self.spec.tp_size,
                                  log_level=self.opts.log_level, trust_remote_code=self.trust_remote_code)

    def start(self) -> None:
        set_platform_env(self.device)
        if self.device == "cpu":
            self._compat = sglang_cpu.activate()  # before SGLang's first import in this process
        if self.task == "generate":
            self._generator = GenerationSession(self._generation_settings())
            self._generator.start()
            self._facts = self._generator.facts()
            return
        settings = self._settings()
        self._session = ModelRunnerSession(settings, start_followers=Followers if settings.tp_size > 1 else None)
        self._session.start()
        self._facts = self._session.facts()
        self._check_layers_to_capture()
        if self._facts["kv_pool_tokens"] < self.max_tokens_per_forward:
            raise ValueError(f"SGLang's KV pool holds {self._facts['kv_pool_tokens']} tokens, fewer than "
                             f"engine.options.max_tokens_per_forward={self.max_tokens_per_forward}: lower it, or "
                             f"raise engine.options.mem_fraction_static")
        if self.plan.needs(TABLE):
            self._table_key, self._table = load_embedding_table(self.model_path, _DTYPES[self._facts["dtype"]])
        # One-off compilations happen here, not mid-run; and the aux states must come back through the loaded
        # model's own forward (a multimodal wrapper's included), one [H] slice per requested layer.
        self._check_aux_returned(self._session.forward([np.arange(1, 9, dtype=np.int64)]))

    def _check_aux_returned(self, result) -> None:
        k = len(self.plan.aux_layer_ids)
        width = self._facts.get("hidden_size")
        got = None if result.aux_TKH is None else tuple(result.aux_TKH.shape[1:])
        if k and got != (k, width):
            raise RuntimeError(
                f"SGLang {self._facts['sglang_version']} ({self._facts['model_class']} around "
                f"{self._facts['text_class']}) was asked for {k} aux states of width {width} per token and its "
                f"forward returned {got}: the aux capture does not reach the output through this model class")

    def _check_layers_to_capture(self) -> None:
        got = self._facts["layers_to_capture"]
        if got != self.plan.layers_to_capture:
            raise RuntimeError(
                f"SGLang {self._facts['sglang_version']} ({self._facts['model_class']}) was given aux ids "
                f"{self.plan.aux_layer_ids} and captures at the input of layers {got}, but the numbering table "
                f"(pipeline.points, family {self.plan.family!r}) expects {self.plan.layers_to_capture}: the table is "
                f"wrong for this SGLang version or model class; refusing to capture shifted layers")

    def _forwards(self, seqs: Sequence[np.ndarray], names: Sequence[str]) -> list[range]:
        """Consecutive index ranges of at most max_tokens_per_forward tokens (the KV pool holds one forward)."""
        groups, first, tokens = [], 0, 0
        for i, (ids, name) in enumerate(zip(seqs, names)):
            if len(ids) > self.max_tokens_per_forward:
                raise ValueError(f"sample {name!r} has {len(ids)} tokens, more than "
                                 f"engine.options.max_tokens_per_forward={self.max_tokens_per_forward}")
            if i > first and tokens + len(ids) > self.max_tokens_per_forward:
                groups.append(range(first, i))
                first, tokens = i, 0
            tokens += len(ids)
        return groups + ([range(first, len(seqs))] if len(seqs) > first else [])

    def _sources(self, result) -> list[torch.Tensor]:
        """One [T, H] tensor per requested point, in request order (views; copied once per sample below)."""
        sources = []
        for p in self.plan.points:
            if p.source == AUX:
                sources.append(result.aux_TKH[:, p.column])
            elif p.source == TABLE:
                sources.append(lookup(self._table, result.input_ids_T))
            else:
                sources.append(result.post_norm_TH)
        return sources

    def _capture_group(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        result = self._session.forward([np.asarray(s.input_ids_T, dtype=np.int64) for s in samples])
        expected = [s.num_tokens for s in samples]
        if result.lengths != expected:
            raise RuntimeError(f"SGLang's forward batch counted {result.lengths} tokens per request, "
                               f"the samples have {expected}")
        sources = self._sources(result)
        captures, start = [], 0
        for s in samples:
            rows = slice(start, start + s.num_tokens)
            captures.append(Capture(sample_id=s.sample_id, input_ids_T=result.input_ids_T[rows].numpy().copy(),
                                    hidden_states_TPH=torch.stack([src[rows] for src in sources], dim=1)))
            start += s.num_tokens
        return captures

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        groups = self._forwards([s.input_ids_T for s in samples], [s.sample_id for s in samples])
        return [c for group in groups for c in self._capture_group([samples[i] for i in group])]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if self._generator is None:
            raise GenerationUnsupported(f"engine={self.spec.name!r} was started for task={self.task!r}: only an "
                                        f"engine made with task='generate' generates")
        return self._generator.generate(requests)

    def _generate_info(self) -> EngineInfo:
        import transformers

        facts = self._facts
        return EngineInfo(
            framework="sglang", framework_version=facts["sglang_version"], dtype=facts["dtype"],
            quantization={"method": facts["quantization"], "dequantized_at_load": False},
            attention_backend=facts["attention_backend"],
            parallel={"tp": facts["tp"], "pp": facts["pp"], "dp": 1},
            libraries={"sglang": facts["sglang_version"], "torch": torch.__version__,
                       "transformers": transformers.__version__},
            points=[],
            extra={"task": "generate",
                   "runner": "sglang.Engine (scheduler with continuous batching, decode and its sampler, in spawned "
                             "processes), prompts as token ids, skip_tokenizer_init",
                   "architecture": facts["architecture"], "device": facts["device"],
                   "sampling_backend": facts["sampling_backend"], "radix_cache": RADIX_CACHE_WHY,
                   "cuda_graph": "disabled" if self.device == "cpu" else "enabled",
                   "kv_pool_tokens": facts["kv_pool_tokens"], "context_length": facts["context_length"],
                   "eos_token_ids": facts["eos_token_ids"],
                   "seed": "per-request sampling_seed passed but not used: SGLang reads it only under "
                           "enable_deterministic_inference, not enabled here (0.5.23 refuses it with torch_native, "
                           "the CPU backend); sampling draws from the scheduler's generator seeded by random_seed",
                   "trust_remote_code": self.trust_remote_code, "cpu_compat": self._compat},
        )

    def info(self) -> EngineInfo:
        import transformers

        if self.task == "generate":
            return self._generate_info()
        facts = self._facts
        moe = facts["moe"] or {}
        return EngineInfo(
            framework="sglang", framework_version=facts["sglang_version"], dtype=facts["dtype"],
            quantization={"method": facts["quantization"], "kernel": moe.get("kernel", "dense (no MoE layer)"),
                          "moe": facts["moe"], "dequantized_at_load": False},
            attention_backend=facts["attention_backend"],
            parallel={"tp": facts["parallel"]["tp"], "pp": facts["parallel"]["pp"], "dp": 1},
            libraries={"sglang": facts["sglang_version"], "torch": torch.__version__,
                       "transformers": transformers.__version__},
            points=self.plan.sources(self._table_key),
            extra={"runner": "in-process sglang ModelRunner (sglang.benchmark.one_batch recipe), extend only",
                   "model_class": facts["model_class"], "text_class": facts["text_class"],
                   "wrapper_class": facts["model_class"] if facts["model_class"] != facts["text_class"] else None,
                   "trust_remote_code": self.trust_remote_code, "device": facts["device"],
                   "aux_layer_ids": self.plan.aux_layer_ids, "layers_to_capture": facts["layers_to_capture"],
                   "aux_anchor_id0_dropped": self.plan.anchor, "radix_cache": "disabled", "cuda_graph": "disabled",
                   "kv_pool_tokens": facts["kv_pool_tokens"], "max_tokens_per_forward": self.max_tokens_per_forward,
                   "cpu_compat": self._compat},
        )

    def close(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        if self._session is not None:
            self._session.close()
            self._session = None
        self._table = None
