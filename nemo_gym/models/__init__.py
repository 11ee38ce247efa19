"""Model-side internals: Responses <-> Chat conversion, the Chat backend, streaming events, request
shape checks, the token-ID splice and everything that depends on vLLM's version."""
