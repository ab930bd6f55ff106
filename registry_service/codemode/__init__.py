"""Code mode: the `run_code` transport, its per-run scheduler and the parent token.

Domain code (no grpc): the runtime is reached through the `RuntimePort` protocol.
"""
