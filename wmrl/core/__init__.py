"""Bottom layer: feature names, protocols, registries, atomic file helpers."""
