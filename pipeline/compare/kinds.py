"""The fixed words of a comparison: engine roles, pair kinds, verdicts and check outcomes, probe steps.

Each set is defined once here and compared by member, not by string literal. They are StrEnums, so report.json,
report.md and report.html write the same words as before (json and f-strings write the value), and a report read
back with plain strings compares equal to them.
"""
from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """An engine's part in a comparison."""
    REFERENCE = "reference"  # what every other engine is judged against
    PRIMARY = "primary"  # the extract gate's engine: the one whose states are written
    ENGINE = "engine"  # any other compared engine


class PairKind(StrEnum):
    """What a pair of captures compares."""
    REFERENCE = "reference"  # an engine against the reference (judged)
    PAIR = "pair"  # two engines, neither the reference (reported, not judged)
    DETERMINISM = "determinism"  # the same batch twice
    BATCH = "batch"  # samples alone against the same samples in the batch


class Status(StrEnum):
    """A verdict: of a pair, of the whole comparison, of the extract gate (OFF: the gate did not run)."""
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    OFF = "off"


class Check(StrEnum):
    """The outcome of a check that has no 'pass' wording: a checkpoint anchor, an engine's alignment."""
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


class Match(StrEnum):
    """Where the alignment matrix puts one claimed point."""
    OK = "ok"  # nearest its own reference point
    MISALIGNED = "misaligned"  # clearly nearer another one
    AMBIGUOUS = "ambiguous"  # nearer another one, but not by the margin
    MISSING = "missing"  # near no reference point
    UNVERIFIED = "unverified"  # downstream of a numerical divergence: cannot be told


class PointVerdict(StrEnum):
    """One point of a judged pair, walked in canonical order."""
    OK = "ok"  # within the thresholds, before the onset
    OVER = "over"  # the onset
    FLIPS = "flips"  # the onset and after it, when the divergence is MoE routing flips
    DOWNSTREAM = "downstream"  # after the onset


class Step(StrEnum):
    """The step of probing an engine that raised its error."""
    MAKE = "make"
    START = "start"
    PROBE = "probe"
