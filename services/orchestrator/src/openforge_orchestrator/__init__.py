"""OpenForgeRL orchestrator: rollouts of real harnesses in sandboxes."""
