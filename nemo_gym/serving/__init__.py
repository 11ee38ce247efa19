"""Serving: the server base every server runs on, the request guard, the client servers call each other
with, HTTP to upstream engines, secrets, the wire protocol's shared names, memory release."""
