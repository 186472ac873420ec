"""OpenForgeRL shared core: settings, telemetry, gRPC kit, events, errors.

Written once, used by every service. Nothing here knows a particular service's
internals; it holds the contracts of the services' APIs that are not in the
protos (:mod:`.run_config`: the trainer's run config; :mod:`.engine_names`: the
inference engines), so the CLI and the services read them from one place.
"""
