"""pipeline.accept: acceptance of EAGLE-3 drafts measured from the serving engine's own counters."""
