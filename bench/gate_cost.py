"""The diff gate's cost on the default run, side by side (not a test: run by hand).

    .venv/bin/python bench/gate_cost.py [--rounds 6] [--extra override ...]

Runs `python -m pipeline.extract` exactly as a user does (the embedded default: tiny Kimi INT4, bundled data, HF),
once with the gate (gate.mode=stop, the default) and once without (gate.mode=off), alternating, each in a fresh
process. Prints, per round:
- the gate's own time as extract measures and prints it (reference engine start/probe/close, primary probe,
  analysis, report), as a fraction of the whole run;
- the marginal cost: total with the gate minus total without, as a fraction of the run with the gate, measured twice:
  on the run as extract times it (from the config to the manifest) and on the whole command as the user waits for it
  (the process, interpreter start and imports included).
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
from statistics import median

REPO = Path(__file__).resolve().parents[1]
_GATE = re.compile(r"diff gate: (\w+) \(gate\.mode=\w+\) in ([\d.]+)s = ([\d.]+)% of this run")
_TOTAL = re.compile(r"rejected \(see rejects\.parquet\); ([\d.]+)s")


def extract(out: Path, *overrides: str) -> tuple[float, float, float | None, str]:
    """(run seconds as extract reports them, process seconds, gate seconds or None, gate status)."""
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
    return total, wall, (float(gate.group(2)) if gate else None), (gate.group(1) if gate else "off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for both runs (e.g. data.limit=20)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-cost-") as tmp:
        rows = []
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            on_first = r % 2 == 0  # alternate the order: a warm page cache favours whichever runs second
            runs = {}
            for mode in (("on", "off") if on_first else ("off", "on")):
                gate = [] if mode == "on" else ["gate.mode=off"]
                runs[mode] = extract(Path(tmp) / f"r{r}-{mode}", *gate, *args.extra)
            rows.append((*runs["on"], *runs["off"][:2]))
        print("\ndefault run (tiny Kimi INT4, bundled conversations, HF engine; gate: primary hf vs hf@float32)")
        for with_gate, wall_on, gate_s, status, without, wall_off in rows:
            marginal, marginal_wall = with_gate - without, wall_on - wall_off
            print(f"  run with gate {with_gate:5.1f}s (gate {status}: {gate_s:.1f}s = {gate_s / with_gate:.1%}), "
                  f"without {without:5.1f}s: marginal {marginal:+.1f}s = {marginal / with_gate:+.1%} | command "
                  f"{wall_on:5.1f}s vs {wall_off:5.1f}s: marginal {marginal_wall:+.1f}s = {marginal_wall / wall_on:+.1%}")
        # A shared VM swings single runs by +-2 s, more than the gate costs: compare the modes' medians over rounds.
        for name, on, off in (("run", 0, 4), ("command", 1, 5)):
            with_gate, without = median([r[on] for r in rows]), median([r[off] for r in rows])
            print(f"{name}: median {with_gate:.1f}s with the gate, {without:.1f}s without: marginal "
                  f"{with_gate - without:+.1f}s = {(with_gate - without) / with_gate:+.1%} (target <= 10%)")


if __name__ == "__main__":
    main()
