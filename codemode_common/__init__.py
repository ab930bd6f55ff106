"""Code shared by both services and the Python client: generated stubs, JSON codec, errors."""
