"""State-space dynamics for offline model-based RL: the Gaussian ensemble and the true-dynamics oracle."""

from world_models.dynamics.ensemble import EnsembleConfig, GaussianEnsemble, TrueDynamics, fit_ensemble

__all__ = ["EnsembleConfig", "GaussianEnsemble", "TrueDynamics", "fit_ensemble"]
