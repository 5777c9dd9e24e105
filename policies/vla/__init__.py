"""`vla`: a small multi-task vision-language-action policy with a Gaussian (RL) or flow-matching (BC) chunk head."""

from policies.vla.modeling import VLAConfig, VLAPolicy

__all__ = ["VLAConfig", "VLAPolicy"]
