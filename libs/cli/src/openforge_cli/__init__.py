"""The ``openforge`` command."""
