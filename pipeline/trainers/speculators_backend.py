"""speculators' hidden-states backend `pipeline-run`: a reference export's samples read from the run's shards.

Imported only in speculators' environment (it imports hs_connectors); importing it registers the backend, which must
happen before `speculators.train.config.resolution` is imported (it collects the backends' arguments then):
pipeline/trainers/speculators.py does it first. The classes live at module level so that the data loader's workers
(spawned) can unpickle the transfer; each worker maps its own shards (pipeline/exports/run_states.py).
"""
from __future__ import annotations

import argparse
from typing import Any

import torch
from hs_connectors import HiddenStatesBackend, HiddenStatesTransfer

from pipeline.exports.run_states import RunStates, RunStatesError

BACKEND = "pipeline-run"


class RunTransfer(HiddenStatesTransfer):
    """speculators' cached read (`get_cached(i)`, sample i of the dataset) answered from the run."""

    def __init__(self, states: RunStates) -> None:
        self.states = states

    def get_cached(self, file_idx: int) -> dict[str, torch.Tensor]:
        return self.states.sample(file_idx)  # never None: a sample that cannot be read raises, it is not skipped

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        raise RunStatesError(f"{self.states.export_dir}: a reference export holds every sample of its run; the "
                             "pipeline-run backend generates none")


@HiddenStatesBackend.register(BACKEND)
class RunBackend(HiddenStatesBackend):
    """--hidden-states-backend pipeline-run: the states of a `--states reference` export, read from its run."""

    @staticmethod
    def add_train_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--run-key", type=str, default=None,
                            help="pipeline-run: the run signer's Ed25519 public key (PEM); the trainer's start then "
                                 "proves the run as `python -m pipeline.verify RUN --key` does (reads every file)")

    @staticmethod
    def add_launch_args(parser: argparse.ArgumentParser) -> None:
        """Nothing: the states are read from a finished run, never produced by a serving engine."""

    @staticmethod
    def from_train_args(args: argparse.Namespace, data_path: str) -> RunTransfer:
        states = RunStates(data_path)
        states.check(key=getattr(args, "run_key", None))  # at the trainer's start, before any batch
        return RunTransfer(states)

    @staticmethod
    def build_kv_transfer_config(args: argparse.Namespace) -> dict[str, Any]:
        raise RunStatesError("the pipeline-run backend reads a finished run; it configures no vLLM connector")
