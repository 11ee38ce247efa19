"""The ``docker`` and ``podman`` sandbox providers: containers through the engine's HTTP API."""

from nemo_gym.sandbox.providers.docker.provider import DockerProvider, PodmanProvider

__all__ = ["DockerProvider", "PodmanProvider"]
