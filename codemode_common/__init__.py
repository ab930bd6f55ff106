"""Code both services share (server set-up, settings, TLS, the telemetry SDK side).

What the Python client shares with them too (stubs, JSON codec, errors) is `codemode_wire`,
shipped by the client's distribution."""
