"""Reinforcement learning: in imagination (GRPO, PPO, co-evolution) and offline / offline-to-online (SAC-N/EDAC,
TD3+BC, IQL, MBPO/MOPO/RAVL, WSRL); `agents` names the state-based agents and loads their checkpoints."""
