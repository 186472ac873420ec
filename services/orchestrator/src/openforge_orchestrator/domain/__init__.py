"""Pure orchestrator logic: no grpc, no nats."""
