"""Accuracy and agreement studies: nested evaluation, recordings, tilt, test-time augmentation, baselines."""
