"""Reinforcement learning: in imagination (GRPO, PPO) and, later, offline model-based agents."""
