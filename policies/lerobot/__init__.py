"""LeRobot's ACT and Diffusion Policy checkpoints, read without installing lerobot (`--policy.type act|diffusion
--policy.path DIR`): evaluated, ranked and deployed like any policy here. They have no tractable action
likelihood, so GRPO in imagination does not train them."""
