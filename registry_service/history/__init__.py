"""Durable two-layer history: outer `tool/call`/`tool/result` records (the only layer that
derives model messages) and nested `tool/code-dispatch-start`/`tool/code-dispatch` records."""
