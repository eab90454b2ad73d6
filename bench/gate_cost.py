"""The diff gate's cost on the default run, side by side (not a test: run by hand).

    .venv/bin/python bench/gate_cost.py [--rounds 1] [--extra override ...]

Runs `python -m pipeline.extract` exactly as a user does (the embedded default: tiny Kimi INT4, bundled data, HF),
once with the gate (diff.gate=stop, the default) and once without (diff.gate=off), alternating, each in a fresh
process. Prints, per round:
- the gate's own time as extract measures and prints it (reference engine start/probe/close, primary probe,
  analysis, report), as a fraction of the whole run;
- the marginal cost: total with the gate minus total without, as a fraction of the run with the gate.
Target: <= 10%. The machine's load matters (both runs share it); run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_GATE = re.compile(r"diff gate: (\w+) \(diff\.gate=\w+\) in ([\d.]+)s = ([\d.]+)% of this run")
_TOTAL = re.compile(r"rejected \(see rejects\.parquet\); ([\d.]+)s")


def extract(out: Path, *overrides: str) -> tuple[float, float | None, str]:
    """(run seconds as extract reports them, gate seconds or None, gate status)."""
    cmd = [sys.executable, "-m", "pipeline.extract", f"out_dir={out}", f"hydra.run.dir={out}.logs", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"extract failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    total = float(_TOTAL.search(proc.stdout).group(1))
    gate = _GATE.search(proc.stdout)
    print(f"    {' '.join(overrides) or '(defaults)'}: run {total:.1f}s (process {wall:.1f}s)"
          + (f", gate {gate.group(1)} {float(gate.group(2)):.1f}s" if gate else ""), flush=True)
    return total, (float(gate.group(2)) if gate else None), (gate.group(1) if gate else "off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for both runs (e.g. data.limit=20)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-cost-") as tmp:
        rows = []
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            on_first = r % 2 == 0  # alternate the order: a warm page cache favours whichever runs second
            runs = {}
            for mode in (("on", "off") if on_first else ("off", "on")):
                gate = [] if mode == "on" else ["diff.gate=off"]
                runs[mode] = extract(Path(tmp) / f"r{r}-{mode}", *gate, *args.extra)
            (with_gate, gate_s, status), (without, _, _) = runs["on"], runs["off"]
            rows.append((with_gate, gate_s, without, status))
        print("\ndefault run (tiny Kimi INT4, bundled conversations, HF engine; gate: primary hf vs hf@float32)")
        for with_gate, gate_s, without, status in rows:
            marginal = with_gate - without
            print(f"  with gate {with_gate:7.1f}s (gate {status}: {gate_s:.1f}s = {gate_s / with_gate:.1%} of the run)"
                  f" | without {without:7.1f}s | marginal {marginal:+.1f}s = {marginal / with_gate:+.1%}"
                  f"  (target <= 10%)")


if __name__ == "__main__":
    main()
