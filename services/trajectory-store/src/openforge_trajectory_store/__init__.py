"""OpenForgeRL trajectory store: the durable record of calls and rollouts."""
