"""HAR data: the UCI HAR loader, the synthetic generator, splits, normalisation and loaders."""
