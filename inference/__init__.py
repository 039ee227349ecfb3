"""Using a trained checkpoint: classify whole recordings, evaluate a split, export the model."""
