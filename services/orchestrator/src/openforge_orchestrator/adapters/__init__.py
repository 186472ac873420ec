"""Outbound adapters: event publishing, proxy and store clients."""
