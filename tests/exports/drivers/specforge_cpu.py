"""SpecForge's own training CLI, unchanged, on a machine without a GPU: `python specforge_cpu.py train --config
run.yaml [overrides]` is `specforge train --config run.yaml [overrides]` (entry point `specforge.cli:main`) with one
process, its device redirected to the CPU and nothing else.

What SpecForge 0.2.0 (torch 2.14.1+cu130 in .venv-specforge) already does on a CPU, read from its source: the device
comes from `specforge.utils.get_device_type` (SPECFORGE_DEVICE first, then CUDA, NPU, CPU); on "cpu"
`specforge.distributed.init_distributed` picks gloo, binds no device and builds its device meshes on cpu,
`get_local_device` places the draft, the wrapped model and the target head there, the offline feature loader pins no
memory, and `OnlineEagle3Model.forward`'s `torch.cuda.empty_cache()` does nothing when CUDA was never initialised.
So the device needs no replaced function, only SpecForge's own switch, SPECFORGE_DEVICE=cpu (set here, so that a
machine with a GPU runs the same). Two things below the CLI cannot run on CPU tensors as they are called, and they
are the only ones changed:

- `specforge.training.backend.FSDPTrainingBackend.prepare_model` wraps the model in FSDP1 (the default
  `training.fsdp_sharding: SHARD_GRAD_OP`) without a `device_id`; FSDP then takes the current accelerator and
  refuses a CPU (torch/distributed/fsdp/_init_utils.py `_init_device_handle`: "FSDP needs a non-CPU accelerator
  device, but no accelerator device is detected"). `torch.distributed.fsdp.FullyShardedDataParallel`, which
  prepare_model imports when it runs, is replaced by a subclass whose `device_id` defaults to the CPU: the same
  sharding, bf16 mixed precision and full state dict, on the CPU. (`training.fsdp_sharding: NO_SHARD` would wrap
  in DDP, which runs on gloo as it is, but that is not the recipe SpecForge runs by default.)
- the EAGLE-3 loss, `specforge.core.loss.LogSoftmaxLoss` (called by `algorithms/eagle3/model.py`
  `_compute_loss_and_acceptance_rate` whatever `training.lk_loss_type` says: the config offers no torch loss), is a
  Triton kernel with no torch path (launched without a GPU: "RuntimeError: 0 active drivers"); TRITON_INTERPRET=1,
  set before triton is first imported, makes Triton's own interpreter run that kernel on CPU tensors.

Everything else (config parsing and validation, the launch plan, listing and reading the export's feature files,
vocabulary mapping, TTT, loss, optimiser, scheduler, logging and checkpoint writing) runs as its users run it. One
process only: with `deployment.trainer.nproc_per_node` > 1 the CLI launches torchrun workers, which do not run this
shim. On 2 CPU cores a short run wants `training.attention_backend: sdpa`, a short `training.ttt_length`, a small
`data.max_length`, `data.dataloader_num_workers: 0` and TORCH_COMPILE_DISABLE=1 (the compiled helpers compute the
same in eager mode; inductor's C++ build of them costs ~40 s on a CPU).
"""
from __future__ import annotations

import os
import sys

os.environ["SPECFORGE_DEVICE"] = "cpu"
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.distributed.fsdp as fsdp  # noqa: E402

CPU = torch.device("cpu")


class CpuFSDP(fsdp.FullyShardedDataParallel):
    """FSDP1 as SpecForge builds it, told the device it runs on (it only infers an accelerator)."""

    def __init__(self, module: torch.nn.Module, *args, **kwargs) -> None:
        kwargs.setdefault("device_id", CPU)
        super().__init__(module, *args, **kwargs)


def redirect_to_cpu() -> None:
    fsdp.FullyShardedDataParallel = CpuFSDP


if __name__ == "__main__":
    redirect_to_cpu()
    from specforge.cli import main

    sys.exit(main())
