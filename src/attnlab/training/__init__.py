"""The Lightning training layer: the module, its callbacks and checkpoint I/O, config validation and the
training pipeline (`attnlab.training.pipeline.train`)."""
