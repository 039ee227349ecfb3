"""What a run tells: console and TensorBoard, metrics, memory figures and pictures."""
