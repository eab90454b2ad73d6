"""The cross-framework diff: the same probe prompts through several engines, compared point by point.

    spec      engine entries (`name`, `name@dtype`, or a mapping) and their presets (conf/engine/<name>.yaml)
    entries   entries resolved against the model, made through `make_engine` (any registered engine, any venv)
    probe     the probe samples; one engine's captures: the batch, repeats (determinism), samples alone (batching)
    metrics   per-point statistics in float32: relative L2 (aggregate, per-token quantiles), cosine, max abs,
              position 0 vs later positions, per-position profiles
    checkpoint  the embedding table, final RMSNorm and LM head read from the checkpoint; which layers are MoE
    align     the alignment matrix: which reference point each claimed point really is
    judge     thresholds per dtype, the first divergent point, its likely locus, MoE routing flips
    analyze   every judged comparison of a set of runs -> DiffResult
    report    report.json / report.md, the compact summary for manifest and shards, the terminal verdict
    html      report.html with embedded plots
    stage     `run_diff` (python -m pipeline.diff) and `compare` (shared with the gate)
    gate      the gate of python -m pipeline.extract (before any shard is written)
"""
