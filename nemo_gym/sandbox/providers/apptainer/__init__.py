"""The ``apptainer`` sandbox provider: Apptainer instances through the ``apptainer`` CLI."""

from nemo_gym.sandbox.providers.apptainer.provider import (
    ApptainerCreateConfig,
    ApptainerCreateError,
    ApptainerCreateVerificationError,
    ApptainerExecConfig,
    ApptainerProbeConfig,
    ApptainerProvider,
)

__all__ = [
    "ApptainerCreateConfig",
    "ApptainerCreateError",
    "ApptainerCreateVerificationError",
    "ApptainerExecConfig",
    "ApptainerProbeConfig",
    "ApptainerProvider",
]
