"""The PostgreSQL history store (`history_store: postgres`): schema migrations, the store, the
writer leases of a database shared by several registries, and the Cordis records."""
