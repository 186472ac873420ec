"""Outbound adapters: the inference client, the call-record publisher and the large-body parser
process."""
