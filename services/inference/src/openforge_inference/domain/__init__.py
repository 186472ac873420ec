"""Pure inference logic: no grpc, no nats."""
