"""Launching: configuration (YAML + overrides), the launcher and its hooks, the head server's registry,
and the Ray backend that places server processes on a cluster."""
