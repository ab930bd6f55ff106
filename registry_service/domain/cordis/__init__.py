"""Dynamic Cordis in the registry: identities, immutable packages and version pointers, the seven
model tools, the inspect registry and `@pluginId` references (docs/cordis.md). Host halves run
in plugin hosts behind the `plugin_hosts` seam; this package never imports grpc."""
