"""OpenForgeRL proxy: serves every model call a harness makes and records it."""
