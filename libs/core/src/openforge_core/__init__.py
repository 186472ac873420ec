"""OpenForgeRL shared core: settings, telemetry, gRPC kit, events, errors.

Written once, used by every service. Nothing here knows about a particular
service.
"""
