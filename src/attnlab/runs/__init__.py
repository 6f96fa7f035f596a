"""Run directories: their layout, checkpoints, manifest, results and W&B records."""
