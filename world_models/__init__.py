"""Learned simulators: the action-conditioned video world model (`world_models.video`) and `WorldModelEnv`."""
