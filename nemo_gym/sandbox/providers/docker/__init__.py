"""The ``docker`` and ``podman`` sandbox providers: containers through the engine's HTTP API."""

from nemo_gym.sandbox.providers.docker.create_config import DockerCreateConfig
from nemo_gym.sandbox.providers.docker.provider import DockerProvider, PodmanProvider

__all__ = ["DockerCreateConfig", "DockerProvider", "PodmanProvider"]
