"""speculators' own training CLI, unchanged, on a machine without a GPU: `python speculators_cpu.py ARGS...` is
`torchrun -m pipeline.trainers.speculators ARGS...` (speculators' CLI with the project's backend registered) with one
process, its device redirected to the CPU and nothing else.

Why a shim is needed (speculators 0.9.0, torch 2.14.1+cu130 in .venv-speculators): the trainer moves the model and each
batch to `get_local_rank()` (the int 0, i.e. cuda:0), its checkpointer loads onto `get_current_device()` ("cuda:0" when
no accelerator answers), and the CUDA build reports a `cuda` accelerator with no GPU behind it (so the DataLoader pins
memory and the step timer synchronises a device that is not there). Those names are the only things replaced; the
CLI's parsing, vocabulary mapping, data loading, loss, optimiser, scheduler and checkpoint writing run as its users
run them. Pass `--hidden-states-dtype float32` (CPU autocast to bf16 is emulated
on CPUs without AMX: ~30x slower), `--draft-attn-impl sdpa`, `--loss-implementation eager` (no triton on CPU) and
`--num-workers 0|1`.
"""
from __future__ import annotations

import torch

CPU = torch.device("cpu")


def redirect_to_cpu() -> None:
    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer

    # check_available=True (the CLI's final empty_cache) must see no accelerator; the trainer's autocast must see cpu
    torch.accelerator.current_accelerator = lambda check_available=False: None if check_available else CPU
    torch.accelerator.is_available = lambda: False  # the DataLoader pins memory on any accelerator it is told of
    torch.accelerator.synchronize = lambda device=None: None  # the step timer's; CPU kernels are synchronous
    trainer.get_local_rank = lambda: "cpu"
    checkpointer.get_current_device = lambda: "cpu"


if __name__ == "__main__":
    # Through the project's wrapper of speculators' CLI (pipeline/trainers/speculators.py): a full export passes as it
    # is; a reference export gets the backend that reads its run. The backend registers before speculators' config
    # resolution is imported (by the trainer modules redirected below).
    import sys

    from pipeline.trainers import speculators as wrapper

    argv = wrapper.prepared_argv(sys.argv[1:])
    wrapper.register()
    redirect_to_cpu()
    sys.exit(wrapper.main(argv))
