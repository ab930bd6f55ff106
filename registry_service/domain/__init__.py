"""The registry's domain: scopes, the tool catalog, policy and the execution pipeline.

Nothing in this package imports grpc; the servicers in `registry_service` translate.
"""
