"""Which engines a comparison runs: config entries resolved against their presets and the model, as ProbeRequests.

Every engine is made through `make_engine`, so an adapter that lands later (or one a test registers) is compared by
naming it; an adapter in its own virtualenv runs in a worker through the same call.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from pipeline.compare.kinds import Role
from pipeline.compare.probe import ProbeRequest
from pipeline.config import ConfigError
from pipeline.config.entries import EngineEntry, SpecError, parse_entries, parse_entry, to_spec, unique
from pipeline.core.contracts import EngineSpec
from pipeline.engines.options import OptionsError
from pipeline.engines.registry import check_name, check_options
from pipeline.models.info import ModelInfo, read_model_info
from pipeline.points import Point


def _model_path(entry: EngineEntry, model: ModelInfo, where: str) -> str:
    if entry.model_path is None:
        return str(model.path)
    try:
        other = read_model_info(entry.model_path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{where} ({entry.display}): model_path={entry.model_path!r}: {e}") from e
    if (other.num_layers, other.hidden_size) != (model.num_layers, model.hidden_size):
        raise ConfigError(f"{where} ({entry.display}): model_path={entry.model_path!r} has {other.num_layers} layers "
                          f"and hidden size {other.hidden_size}; the model has {model.num_layers} and "
                          f"{model.hidden_size}: it is not the same model")
    return str(Path(entry.model_path))


def entry_spec(entry: EngineEntry, where: str) -> EngineSpec:
    """The entry laid over its preset, with its engine name and options checked; config errors name `where`."""
    try:
        check_name(entry.name)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e
    try:
        spec = to_spec(entry)
    except ValueError as e:
        raise ConfigError(f"{where} ({entry.display}): {e}") from e
    try:
        check_options(spec, where)
    except OptionsError as e:
        raise ConfigError(str(e)) from e
    return spec


def probe_run(entry: EngineEntry, *, role: Role, model: ModelInfo, points: Sequence[Point], where: str,
              trust_remote_code: bool = False) -> ProbeRequest:
    """The entry as one engine to probe; config errors name `where`."""
    spec = entry_spec(entry, where)
    return ProbeRequest(label=entry.display, role=role, spec=spec, model_path=_model_path(entry, model, where),
                    points=list(points), trust_remote_code=trust_remote_code)


def reference_entry(value: Any) -> EngineEntry:
    try:
        return parse_entry(value, "diff.reference")
    except SpecError as e:
        raise ConfigError(str(e)) from e


def other_entries(values: Any, where: str, reference: EngineEntry) -> list[EngineEntry]:
    """The entries other than the reference (an entry identical to the reference is the reference)."""
    try:
        entries = unique([reference, *parse_entries(values, where)])
    except SpecError as e:
        raise ConfigError(str(e)) from e
    return entries[1:]


def _entries(reference: Any, others: Any, where: str) -> list[tuple[Role, str, EngineEntry]]:
    """(role, config path, entry): the reference first, then every other entry."""
    ref = reference_entry(reference)
    return [(Role.REFERENCE, "diff.reference", ref)] + [
        (Role.ENGINE, f"{where}[{i}]", entry) for i, entry in enumerate(other_entries(others, where, ref))]


def check_entries(reference: Any, others: Any, where: str) -> None:
    """The config errors `comparison` finds in the entries themselves (engine names, values, options), found without
    the model: for the checks that run before the model is read."""
    for _, at, entry in _entries(reference, others, where):
        entry_spec(entry, at)


def comparison(reference: Any, others: Any, where: str, *, model: ModelInfo, all_points: Sequence[Point],
               points: Sequence[Point], trust_remote_code: bool = False) -> list[ProbeRequest]:
    """The reference (capturing `all_points`) first, then every other entry (capturing `points`)."""
    return [probe_run(entry, role=role, model=model, points=all_points if role == Role.REFERENCE else points, where=at,
                      trust_remote_code=trust_remote_code)
            for role, at, entry in _entries(reference, others, where)]
