"""EDM (Karras, Aittala, Aila, Laine 2022, "Elucidating the Design Space of Diffusion-Based Generative Models"):
the preconditioning of Table 1 and the sampling noise levels of eq. 5, shared by the video world model and the
trajectory diffusion model. The noise levels come from diffusers' EDMEulerScheduler, so both samplers agree with it.

    D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x, c_noise(sigma))
    training    ln sigma ~ N(P_mean, P_std^2),  weight lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2
"""

from __future__ import annotations

import torch
from diffusers import EDMEulerScheduler


def edm_coefficients(sigma: torch.Tensor, sigma_data: float) -> tuple[torch.Tensor, ...]:
    """(c_skip, c_out, c_in, c_noise) of EDM Table 1, as diffusers' EDMEulerScheduler uses them with
    prediction_type="epsilon"."""
    c_skip = sigma_data**2 / (sigma**2 + sigma_data**2)
    c_out = sigma * sigma_data / (sigma**2 + sigma_data**2) ** 0.5
    c_in = 1 / (sigma**2 + sigma_data**2) ** 0.5
    c_noise = 0.25 * torch.log(sigma)
    return c_skip, c_out, c_in, c_noise


def edm_loss_weight(sigma: torch.Tensor, sigma_data: float) -> torch.Tensor:
    """lambda(sigma) of EDM Table 1: makes the effective target F's unit-variance regression target."""
    return (sigma**2 + sigma_data**2) / (sigma * sigma_data) ** 2


def karras_sigmas(steps: int, sigma_min: float, sigma_max: float, sigma_data: float = 1.0, rho: float = 7.0) -> torch.Tensor:
    """The `steps` noise levels of eq. 5 followed by a final 0, from diffusers' scheduler."""
    if steps < 1:
        raise ValueError(f"sampling steps must be >= 1, got {steps}")
    sched = EDMEulerScheduler(sigma_min=sigma_min, sigma_max=sigma_max, sigma_data=sigma_data, rho=rho,
                              prediction_type="epsilon")
    sched.set_timesteps(steps)
    return sched.sigmas.float()


__all__ = ["edm_coefficients", "edm_loss_weight", "karras_sigmas"]
