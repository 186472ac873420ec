"""OpenForgeRL trainer: the RL loop over recorded trajectories."""
