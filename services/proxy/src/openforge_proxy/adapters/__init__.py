"""Outbound adapters: the inference client and the call-record publisher."""
