"""NeMo Gym's ``nemo_gym.telemetry`` package: the names its environments import.

NeMo Gym's optional OpenTelemetry instrumentation is not reproduced here; what NeMo Gym
environments use of it is :mod:`nemo_gym.telemetry.connection_pool`'s destination label, the
logical name of the server an outbound HTTP call goes to (``server_utils.request`` sets it for
the call when connection-pool telemetry is on).
"""
