"""What a run tells while it trains: console, progress bar, TensorBoard, metrics.jsonl and memory figures."""
