"""Performance measurement of the training step: timing, memory, all-reduce cost and scaling predictions."""
