"""Trajectory diffusion for policy-guided synthetic data (PGD, Jackson et al. 2024): a 1-D temporal U-Net over
windows of (state, pre-tanh action, reward, terminal), trained with EDM and sampled with policy guidance."""

from world_models.trajectory_diffusion.model import (DivergedSamples, TrajectoryDiffusion, TrajectoryDiffusionConfig,
                                                     guidance_schedule)
from world_models.trajectory_diffusion.train import config_for, fit_trajectory_diffusion, gather_windows, window_starts

__all__ = ["TrajectoryDiffusion", "TrajectoryDiffusionConfig", "DivergedSamples", "guidance_schedule", "config_for",
           "fit_trajectory_diffusion", "gather_windows", "window_starts"]
