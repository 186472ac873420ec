"""Pure store logic: no grpc, no nats."""
