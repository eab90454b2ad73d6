"""`python -m pipeline.verify RUN_DIR [--key PUB]`: check a finished run directory before training on it, or a finished
regeneration directory (pipeline.regenerate's) before extracting it (pipeline/data/regeneration/verify.py); either
may be on object storage (`s3://bucket/prefix`).

With --key (the signer's Ed25519 public key, PEM), the run's attestation must carry a signature by that key and every
file must be what it attests: what is proven with and without a key is docs/explanation/what-verify-proves.md.

Exit status (docs/reference/exit-codes.md): 0 sound (a summary on stdout); 3 problems found (each on its own stderr
line); 2 not a finished run (missing directory, or no manifest: an unfinished run), or a key that cannot be read.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from pipeline.core.cli import ExitCode, UsageError, interrupts_from_here, run_command
from pipeline.core.storage import location_arg, path_arg

interrupts_from_here(__name__, "verify")  # before the imports below (seconds): Ctrl-C there is one line too

from pipeline.core.stores import open_store  # noqa: E402
from pipeline.data.regeneration import LAYOUT, MANIFEST, START_FILE, is_regeneration  # noqa: E402
from pipeline.data.regeneration import read_manifest as read_regen_manifest  # noqa: E402
from pipeline.shards import attestation  # noqa: E402
from pipeline.shards.manifest import read_manifest  # noqa: E402
from pipeline.shards.verify import verify_run  # noqa: E402
from pipeline.shards.run_at import RunAt  # noqa: E402
from pipeline.shards.signing_keys import load_public_key  # noqa: E402
from pipeline.shards.staged import staged  # noqa: E402
from pipeline.data.regeneration.verify import summary, verify_regeneration  # noqa: E402


def _summary(run_dir: Path | str, manifest: dict, proof: str) -> str:
    return (f"sound: {run_dir}: {len(manifest['shards'])} shard(s), {manifest['num_samples']} samples, "
            f"{manifest['num_tokens']} tokens, points {manifest['points']}, hidden_size {manifest['hidden_size']}, "
            f"dtype {manifest['dtype']}{_storage(manifest.get('storage'))}; {proof}")


def _storage(storage: dict | None) -> str:
    if not storage or storage.get("dtype") == storage.get("capture_dtype"):
        return ""
    return f" (captured in {storage.get('capture_dtype')}, {storage.get('scaling')} scales; read back dequantized)"


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the docs' command reference is generated from it)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.verify", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=location_arg,
                        help="a run directory holding manifest.json and shards/, a regeneration directory, or either "
                             "on object storage (s3://bucket/prefix)")
    parser.add_argument("--key", type=path_arg, default=None, metavar="PUB",
                        help="the Ed25519 public key (PEM) whose private half signed the run (extract's sign_key)")
    parser.add_argument("--scratch", type=path_arg, default=None, metavar="DIR",
                        help="a run on object storage: where its files are staged while it is checked (one shard's "
                             "states at a time; default: the system's temp directory)")
    return parser


def verify(argv: Sequence[str] | None) -> ExitCode:
    args = parser().parse_args(argv)
    if isinstance(args.run_dir, str):
        return _verify_on_store(args.run_dir, args.key, args.scratch)
    if is_regeneration(args.run_dir):
        _no_key(args.key, args.run_dir)
        return _verify_regeneration(args.run_dir)
    key = None if args.key is None else load_public_key(args.key)  # AttestationKeyError: exit 2
    manifest = read_manifest(args.run_dir)  # ManifestError: not a finished run
    problems = verify_run(args.run_dir, key=key)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(problems)} problem(s) in {args.run_dir}", file=sys.stderr)
        return ExitCode.REFUSED
    print(_summary(args.run_dir, manifest, attestation.proof_text(args.run_dir, key)))
    return ExitCode.OK


def _verify_on_store(url: str, key_path: Path | None, scratch: Path | None) -> ExitCode:
    """A run or a regeneration on object storage, read through a staged copy (pipeline.shards.staged): every byte
    read, as on disk."""
    store = open_store(url)
    if store.head(START_FILE) is not None:
        _no_key(key_path, url)
        if store.head(MANIFEST) is None:
            raise UsageError(f"{url} is an unfinished regeneration (no {MANIFEST}): rerun the same "
                             f"pipeline.regenerate command to finish it")
        with staged(store, scratch, kind=LAYOUT) as (root, _):
            return _verify_regeneration(root, name=url)
    key = None if key_path is None else load_public_key(key_path)
    run = RunAt(url)
    manifest = run.manifest()  # ManifestError: not a finished run
    problems, proof = run.verify(key, scratch)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(problems)} problem(s) in {run.name}", file=sys.stderr)
        return ExitCode.REFUSED
    print(_summary(run.name, manifest, proof))
    return ExitCode.OK


def _no_key(key: Path | None, where: Path | str) -> None:
    if key is not None:  # nothing a key could check: "sound" would claim a proof that was never made
        raise UsageError(f"--key {key}: {where} is a regeneration directory, which carries no signature (only a "
                         "run's attestation is signed); verify it without --key")


def _verify_regeneration(root: Path, name: str | None = None) -> ExitCode:
    """`name`: how messages name the directory (a regeneration on object storage: its URL, `root` its staged copy)."""
    read_regen_manifest(root, UsageError)  # unfinished, or a field of the wrong type: exit 2 naming it, as a run's
    problems = verify_regeneration(root)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(problems)} problem(s) in {name or root}", file=sys.stderr)
        return ExitCode.REFUSED
    print(summary(root, name=name))
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline.verify` and the console script `pipeline-verify`."""
    return run_command(lambda: verify(argv))


if __name__ == "__main__":
    sys.exit(main())
