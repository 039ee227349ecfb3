"""Subject-wise cross-validation: folds of whole subjects, one ordinary training run per fold, and their summary."""
