"""The training step, the epoch around it, and what shapes a step (schedule, precision, recipe)."""
