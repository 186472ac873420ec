"""Pure proxy logic: no grpc, no nats."""
