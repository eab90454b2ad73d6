"""Verify a finished regeneration directory (pipeline.regenerate's): every problem one line, none when sound.

Checks: the manifest is a regeneration's; every part it lists is a file inside the directory with the recorded size
and sha256, and its unit marker agrees; each part reads with the records' schema; conversation and record ids derive
from the input's digest, row and sample, in input order; every turn stopped for a reason its ids show (an end-of-turn
id last for "stop", max_tokens or data.max_length reached for "length"); the totals (turns, tokens, truncated turns,
end reasons, rejects) are the manifest's; and the directory holds nothing a regeneration does not write.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline.core.contracts import FINISH_REASONS
from pipeline.core.io import sha256_file
from pipeline.core.outdir import read_marker
from pipeline.data.regeneration import layout as rd
from pipeline.data.regeneration.reader import outside_vocabulary
from pipeline.data.ids import sample_id_for
from pipeline.data.prepare import read_rejects


def _part_problems(root: Path, index: int, part: dict[str, Any]) -> list[str]:
    rel = part["file"]  # the directory's own part: rd.read_manifest checked its name
    path = root / rel
    if path.is_symlink() or not path.is_file():
        return [f"{rel}: missing (or not a regular file)"]
    problems = []
    if path.stat().st_size != part.get("bytes"):
        problems.append(f"{rel}: {path.stat().st_size} bytes, the manifest says {part.get('bytes')}")
    elif sha256_file(path) != part.get("sha256"):
        problems.append(f"{rel}: sha256 differs from the manifest's (the file changed after it was written)")
    marker = read_marker(rd.part_paths(root, index)["marker"])
    if marker is None or (marker.get("files") or {}).get(rel, {}).get("sha256") != part.get("sha256"):
        problems.append(f"{rel}: its unit marker is missing or lists another sha256")
    return problems


def _turn_problems(where: str, turn: dict[str, Any], stop: set[int], max_tokens: int, max_length: int,
                   vocab_size: int | None) -> list[str]:
    out, reason = turn["output_ids"], turn["finish_reason"]
    for name in ("prompt_ids", "output_ids"):
        if (bad := outside_vocabulary(turn[name], vocab_size)) is not None:
            return [f"{where}: {name} holds {bad}, no token id of the target"
                    + (f" (0..{vocab_size - 1})" if vocab_size else "")]
    if reason not in FINISH_REASONS:
        return [f"{where}: finish_reason {reason!r} is not one of {FINISH_REASONS}"]
    if not out:
        return [f"{where}: no generated ids"]
    if reason == "stop" and out[-1] not in stop:
        return [f"{where}: finish_reason stop, but its last id {out[-1]} is no end-of-turn id ({sorted(stop)})"]
    if reason == "length" and len(out) < max_tokens and len(turn["prompt_ids"]) + len(out) < max_length:
        return [f"{where}: finish_reason length after {len(out)} tokens, below max_tokens {max_tokens} and "
                f"data.max_length {max_length}"]
    return []


def verify_regeneration(root: Path) -> list[str]:
    root = Path(root)
    try:
        manifest = rd.read_manifest(root)
    except (OSError, ValueError) as e:
        return [str(e)]
    problems, counts = _records_problems(root, manifest)
    return problems + _totals_problems(root, manifest, counts) + _tree_problems(root, manifest)


def _records_problems(root: Path, manifest: dict) -> tuple[list[str], Counter[str]]:
    """Every listed part, row and turn against the manifest's provenance; the totals the parts hold."""
    prov = manifest.get("provenance") or {}
    sampling, data = prov.get("sampling") or {}, prov.get("data") or {}
    stop = set((sampling.get("stop_token_ids") or {}).get("ids") or [])
    max_tokens = int((sampling.get("values") or {}).get("max_tokens") or 0)
    max_length = int(((prov.get("config") or {}).get("data") or {}).get("max_length") or 0)
    vocab_size = (prov.get("model") or {}).get("vocab_size")  # absent from earlier regenerations: ids >= 0 checked
    vocab_size = vocab_size if isinstance(vocab_size, int) and vocab_size > 0 else None
    problems: list[str] = []
    counts: Counter[str] = Counter()
    last = (-1, -1)
    for index, part in enumerate(manifest.get("parts") or []):
        found = _part_problems(root, index, part)
        problems += found
        if found:
            continue
        table = pq.read_table(root / part["file"])
        if not table.schema.equals(rd.SCHEMA):
            problems.append(f"{part['file']}: its schema is not a regeneration's records")
            continue
        rows = table.to_pylist()
        if len(rows) != part.get("conversations"):
            problems.append(f"{part['file']}: {len(rows)} conversations, the manifest says {part.get('conversations')}")
        for row in rows:
            where = f"{part['file']} conversation {row['conversation_id']}"
            counts["num_conversations"] += 1
            counts[f"end:{row['end_reason']}"] += 1
            if row["record_id"] != sample_id_for(str(data.get("sha256")), row["row"]):
                problems.append(f"{where}: record_id is not the input's row {row['row']}'s")
            if row["conversation_id"] != rd.conversation_id(row["record_id"], row["sample"]):
                problems.append(f"{where}: conversation_id is not its record's sample {row['sample']}'s")
            if (row["row"], row["sample"]) <= last:
                problems.append(f"{where}: out of input order (row {row['row']}, sample {row['sample']})")
            last = (row["row"], row["sample"])
            for turn in row["turns"]:
                problems += _turn_problems(f"{where} turn {turn['turn']}", turn, stop, max_tokens, max_length,
                                           vocab_size)
                counts["turns"] += 1
                counts["generated_tokens"] += len(turn["output_ids"])
                counts["prompt_tokens"] += len(turn["prompt_ids"])
                counts["kept_truncated"] += turn["finish_reason"] == "length"
    return problems, counts


def _totals_problems(root: Path, manifest: dict, counts: Counter[str]) -> list[str]:
    """The manifest's totals against what the parts and the reject files hold."""
    problems = []
    for key in ("num_conversations", "num_turns", "generated_tokens", "prompt_tokens"):
        mine = counts["turns" if key == "num_turns" else key]
        if manifest.get(key) != mine:
            problems.append(f"manifest {key}={manifest.get(key)!r}, the parts hold {mine}")
    if (manifest.get("truncated") or {}).get("kept") != counts["kept_truncated"]:
        problems.append(f"manifest truncated.kept={(manifest.get('truncated') or {}).get('kept')!r}, the parts hold "
                        f"{counts['kept_truncated']} turns stopped at max_tokens")
    stage_rejects = [r for p in sorted((root / rd.RECORDS_DIR).glob("*.rejects.parquet")) for r in read_rejects(p)]
    # a conversation with no turn (its first prompt too long, ...) is a part's reject with its end reason
    ends = Counter({k.removeprefix("end:"): v for k, v in counts.items() if k.startswith("end:")})
    ends.update(r.reason for r in stage_rejects)
    if manifest.get("end_reasons") != dict(ends):
        problems.append(f"manifest end_reasons={manifest.get('end_reasons')!r}, the parts hold "
                        f"{dict(sorted(ends.items()))}")
    n = ((manifest.get("provenance") or {}).get("sampling") or {}).get("n")
    records = manifest.get("num_records") or 0
    if isinstance(n, int) and counts["num_conversations"] + len(stage_rejects) != n * records:
        problems.append(f"the parts hold {counts['num_conversations']} conversations and {len(stage_rejects)} rejected "
                        f"ones, not sampling.n={n} times num_records={manifest.get('num_records')!r}")
    rejects = len(read_rejects(root / rd.REJECTS)) + len(stage_rejects)
    if (manifest.get("rejects") or {}).get("total") != rejects:
        problems.append(f"manifest rejects.total={(manifest.get('rejects') or {}).get('total')!r}, the reject files "
                        f"hold {rejects}")
    return problems


def _tree_problems(root: Path, manifest: dict) -> list[str]:
    """One check of the tree, nested entries included, as a replacement (overwrite=true) makes it
    (pipeline.core.outdir.Layout.foreign); stale temps; parts the manifest does not list."""
    problems = [f"{name}: not a file a regeneration writes" for name in rd.LAYOUT.foreign(root)]
    problems += [f"{p.relative_to(root)}: a stale temp file" for p in rd.LAYOUT.stale_temps(root)]
    listed = {p["file"] for p in manifest.get("parts") or []}
    for path in sorted((root / rd.RECORDS_DIR).iterdir()) if (root / rd.RECORDS_DIR).is_dir() else []:
        rel = path.relative_to(root).as_posix()
        if rd.LAYOUT.holds(rd.RECORDS_DIR, path.name) and rel.endswith(".parquet") \
                and not rel.endswith(".rejects.parquet") and rel not in listed:
            problems.append(f"{rel}: a part the manifest does not list")
    return problems


def summary(root: Path, name: str | None = None) -> str:
    """The one line of a sound regeneration; `name`: how it is named (default `root`)."""
    m = rd.read_manifest(Path(root))
    engine = m["provenance"]["engine"]
    return (f"sound: {name or root}: regeneration of {m['num_records']} records, {m['num_conversations']} conversations, "
            f"{m['num_turns']} turns, {m['generated_tokens']} generated tokens in {len(m['parts'])} part(s); answers "
            f"by {engine['framework']} {engine['framework_version']} ({engine['dtype']}); "
            f"{m['truncated']['turns']} turn(s) stopped at max_tokens")

