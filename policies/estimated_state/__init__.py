"""`estimated-state`: a two-stage pixel policy (object positions estimated from the cameras, then an MLP actor)."""

from policies.estimated_state.modeling import EstimatedStateConfig, EstimatedStatePolicy, ResidualActor, StateEstimator

__all__ = ["EstimatedStateConfig", "EstimatedStatePolicy", "ResidualActor", "StateEstimator"]
