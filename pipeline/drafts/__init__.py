"""EAGLE-3 draft checkpoints against what the shards hold and what a server will feed them
(`python -m pipeline.doctor`)."""
