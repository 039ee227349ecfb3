"""Training: CLI, parallel strategy, loop, schedule, checkpoints, metrics and the trainer that composes them."""
