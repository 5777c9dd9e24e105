"""`estimated-state`: a two-stage pixel policy (object positions estimated from the cameras, then an MLP actor)."""

from policies.estimated_state.modeling import EstimatedStateConfig, EstimatedStatePolicy, StateEstimator

__all__ = ["EstimatedStateConfig", "EstimatedStatePolicy", "StateEstimator"]
