"""Outbound adapters: the other services' clients, checkpoint storage and the metrics sinks."""
