"""The SDK side of telemetry, for process entry points and server set-up code: exporters and
`setup`, the JSON-lines trace file (`jsonl`), log correlation (`logs`), gRPC interceptors
(`interceptors`) and settings (`config`).

The API-only side that domain code and the Python client use (`Instrumented`,
`resolve_tracer_provider`, trace-context `propagation`) is `codemode_wire.telemetry`."""
