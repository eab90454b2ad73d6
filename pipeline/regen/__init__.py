"""The regeneration stage: `python -m pipeline.regenerate` (job.py), its stage (stage.py) and conversations."""
