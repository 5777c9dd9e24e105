"""Learned simulators: the action-conditioned video world model (`world_models.video`), `WorldModelEnv`, and
state-space dynamics for offline RL (`world_models.dynamics`: Gaussian ensemble, true-dynamics oracle)."""
