"""The harness-facing HTTP server (aiohttp) and its metrics."""
