"""Pure trainer logic: no grpc, no nats."""
