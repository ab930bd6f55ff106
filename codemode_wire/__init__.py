"""What both ends of Codemode's gRPC wire share, shipped with the Python client and imported by
the servers from here (one copy): the generated API stubs (`api`), the lossless JSON codec
(`jsonvalue`), the error model (`errors`) and its gRPC mapping (`grpc_status`), UTF-8 text
checks (`text`), results' shared logs (`shared_logs`) and trace-context propagation with the
OpenTelemetry *API* only (`telemetry`).

Everything here depends only on the client distribution's declared dependencies (grpcio,
grpcio-status, protobuf, googleapis-common-protos, opentelemetry-api); nothing here imports the
servers' packages (`codemode_common`, `registry_service`, `runtime_service`)."""
