"""NeMo Gym's sandbox API (``AsyncSandbox``, ``SandboxSpec``, providers)."""
