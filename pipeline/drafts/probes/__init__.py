"""Scripts run by an engine's own interpreter (never imported by the pipeline's environment)."""
