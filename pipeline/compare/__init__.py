"""The cross-framework diff: the same probe prompts through several engines, compared point by point.

    lineup      the config's engine entries (parsed in pipeline.config.entries) resolved against their presets and
                the model, each made through `make_engine` (any registered engine, any venv) as a ProbeRequest
    kinds       the fixed words (StrEnums): engine roles, pair kinds, statuses, alignment matches, probe steps
    probe       the probe samples; a ProbeRequest in, a frozen ProbeCapture out: the batch, repeats (determinism),
                samples alone (batching)
    metrics     per-point statistics in float32: relative L2 (aggregate, per-token quantiles), cosine, max abs,
                position 0 vs later positions, per-position profiles
    anchors     the embedding table, final RMSNorm and LM head read from the checkpoint; which layers are MoE
    align       the alignment matrix: which reference point each claimed point really is
    judge       thresholds per dtype, the first divergent point, its likely locus, MoE routing flips
    analyze     every judged comparison of a set of captures -> a frozen DiffResult
    comparison  `compare`: finished probe captures analysed against the reference (shared by stage and the gate)
    serialize   report.json (a DiffResult to JSON and back) and the compact summary for manifest and shards
    tables      the rows every report form shows (markdown, HTML, terminal) and the verdict
    markdown    report.md
    html        report.html with embedded plots (`python -m pipeline.compare.html DIR` redraws it)
    report      writes report.json, report.md and report.html
    preflight   what every job checks before any model loads (engines, out_dir, data, model): the diff's and extract's
    stage       `run_diff` (python -m pipeline.diff, DiffJobConfig): engines probed one after another, then compared
                and reported

The gate of python -m pipeline.extract (before any shard is written) is pipeline.run.gate: it calls `compare`.
"""
