"""NeMo Gym's sandbox API: run an environment's commands in a sandbox, whatever the back end.

``AsyncSandbox`` (and the blocking ``Sandbox``) over a provider chosen by config:
``local`` (a confined working tree on this machine, the default for tests and laptops),
``docker``/``podman`` (a container through the engine's API). See docs/SANDBOX.md.
"""

from nemo_gym.sandbox.api import AsyncSandbox, Sandbox, SandboxPty
from nemo_gym.sandbox.compose import AsyncSandboxCompose
from nemo_gym.sandbox.config import resolve_provider_config, resolve_provider_metadata
from nemo_gym.sandbox.lifecycle import sandbox_counts
from nemo_gym.sandbox.providers import (
    ConnectableProvider,
    ExecResult,
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxProvider,
    SandboxPtyError,
    SandboxPtySession,
    SandboxPtySpec,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxEndpoint,
    SupportsSandboxNetwork,
    SupportsSandboxPauseResume,
    SupportsSandboxPortForwarding,
    SupportsSandboxPty,
    SupportsSandboxPtyAttach,
    SupportsSandboxRuntimeRequirements,
    SupportsSandboxSharedStorage,
    create_provider,
    get_provider_class,
    list_providers,
    register_provider,
)
from nemo_gym.sandbox.utils import rewrite_image

__all__ = [
    "AsyncSandbox",
    "AsyncSandboxCompose",
    "ConnectableProvider",
    "ExecResult",
    "Sandbox",
    "SandboxCreateError",
    "SandboxCreateVerificationError",
    "SandboxEndpoint",
    "SandboxExecResult",
    "SandboxHandle",
    "SandboxProvider",
    "SandboxPty",
    "SandboxPtyError",
    "SandboxPtySession",
    "SandboxPtySpec",
    "SandboxResources",
    "SandboxSpec",
    "SandboxStatus",
    "SupportsSandboxEndpoint",
    "SupportsSandboxNetwork",
    "SupportsSandboxPauseResume",
    "SupportsSandboxPortForwarding",
    "SupportsSandboxPty",
    "SupportsSandboxPtyAttach",
    "SupportsSandboxRuntimeRequirements",
    "SupportsSandboxSharedStorage",
    "create_provider",
    "get_provider_class",
    "list_providers",
    "register_provider",
    "resolve_provider_config",
    "resolve_provider_metadata",
    "rewrite_image",
    "sandbox_counts",
]
