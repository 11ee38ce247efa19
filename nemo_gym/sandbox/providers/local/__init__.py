"""The ``local`` sandbox provider: confined working trees on this machine."""

from nemo_gym.sandbox.providers.local.provider import LocalProvider

__all__ = ["LocalProvider"]
