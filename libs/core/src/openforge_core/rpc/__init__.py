"""gRPC server and client kit shared by every service."""
