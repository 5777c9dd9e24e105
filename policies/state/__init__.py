"""State-based actors and critics (offline and online RL)."""
