"""Python client for Codemode: serve tools to the registry and call it."""

from codemode_client.provider import InvocationContext, ProviderError, ToolFailed, ToolProvider

__all__ = ["InvocationContext", "ProviderError", "ToolFailed", "ToolProvider"]
