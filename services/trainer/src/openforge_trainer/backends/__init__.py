"""Trainer backends behind :class:`~openforge_trainer.backends.base.TrainerBackend`."""
