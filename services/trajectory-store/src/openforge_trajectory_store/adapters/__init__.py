"""Inbound and outbound adapters: the NATS event consumer."""
