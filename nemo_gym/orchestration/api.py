"""What ``gym eval submit`` takes: NeMo Gym 0.7.0's submit config shape.

``services`` (a Ray cluster over node pools, vLLM servers), ``compute`` (one Slurm cluster:
account, walltime, node pools), ``driver`` (how the collection runs and reaches the policy),
``job`` (where results go) and ``otel``. Unknown fields are errors, so a typo fails at submit
time rather than inside a queued job.

Differences from NeMo Gym, each deliberate: a service's or the driver's ``container`` may be
null, meaning "run on the node's host with this Python environment" (clusters without Pyxis,
and the test cluster); ``vllm_pd`` services are refused with a message (no prefill/decode split
here); OpenTelemetry is rendered only when ``otel.endpoint`` is set.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RUNTIME_PREFIX = "runtime:"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def resolve_env(env: dict[str, str]) -> dict[str, str]:
    """``lit:VALUE`` → VALUE, ``host:VAR`` → the submitter's ``$VAR``, ``runtime:VAR`` kept for the
    job's own environment. Any other spelling is an error naming the key."""
    out: dict[str, str] = {}
    for key, raw in env.items():
        prefix, _, rest = str(raw).partition(":")
        if prefix == "lit":
            out[key] = rest
        elif prefix in ("host", "runtime"):
            if not _ENV_NAME.match(rest):
                raise ValueError(f"env[{key!r}]: {rest!r} is not an environment variable name")
            if prefix == "runtime":
                out[key] = RUNTIME_PREFIX + rest
            elif rest not in os.environ:
                raise ValueError(
                    f"env[{key!r}] reads host:{rest}, which is not set where gym eval submit runs"
                )
            else:
                out[key] = os.environ[rest]
        else:
            raise ValueError(f"env[{key!r}]: {raw!r} must start with lit:, host: or runtime:")
    return out


class HealthCheckConfig(_Strict):
    """An HTTP path polled on a service before the driver starts."""

    path: str = "/health"
    port: int | None = None
    timeout_seconds: int = 60


class _Service(_Strict):
    container: str | None = None
    placement: str | None = None
    node_pool: str | None = None
    health_check: HealthCheckConfig | None = None
    env: dict[str, str] = {}
    mounts: list[str] = []
    pre_command: str = ""

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return resolve_env(value)


class VllmServiceConfig(_Service):
    """``vllm serve`` on the nodes of a pool (GPU clusters)."""

    type: Literal["vllm"]
    model: str
    port: int = 8000
    served_model_name: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    trust_remote_code: bool = False
    number_of_instances: int = Field(default=1, ge=1)
    use_ray_serve: bool = False
    extra_args: str = ""
    data_parallel_rpc_port: int = 13345

    @model_validator(mode="after")
    def _health(self) -> VllmServiceConfig:
        if self.health_check is None:
            self.health_check = HealthCheckConfig(port=self.port)
        elif self.health_check.port is None:
            self.health_check.port = self.port
        return self


class RayServiceConfig(_Service):
    """A Ray cluster over the nodes of ``node_pools``: the stack's servers are placed on it."""

    type: Literal["ray"]
    node_pools: list[str] = []
    port: int = 6379
    resources: dict[str, dict[str, float]] = {}
    num_cpus: int | None = None
    num_gpus: int | None = None
    extra_args: str = ""

    @model_validator(mode="after")
    def _shape(self) -> RayServiceConfig:
        if self.node_pool is not None:
            raise ValueError(
                f"a ray service spans node_pools, not one node_pool: use node_pools: [{self.node_pool}]"
            )
        extra = sorted(set(self.resources) - set(self.node_pools))
        if extra:
            raise ValueError(f"a ray service sets resources for {extra}, which are not in its node_pools")
        return self


ServiceConfig = Annotated[VllmServiceConfig | RayServiceConfig, Field(discriminator="type")]


class NodePool(_Strict):
    """Contiguous nodes of the allocation, in declaration order."""

    partition: str
    nodes: int = Field(default=1, ge=1)
    ntasks_per_node: int = 1
    gpus_per_node: int | None = None
    extra_args: dict[str, str] = {}


class SlurmComputeConfig(_Strict):
    """One Slurm cluster. ``hostname`` None: submit from this machine (the login node)."""

    type: Literal["slurm"]
    account: str
    hostname: str | None = None
    walltime: str | None = None
    node_pools: dict[str, NodePool] = {}
    extra_args: dict[str, str] = {}

    @property
    def total_nodes(self) -> int:
        """Nodes of the whole allocation (1 without pools)."""
        return sum(pool.nodes for pool in self.node_pools.values()) or 1

    def pool_offsets(self) -> dict[str, tuple[int, int]]:
        """Pool name → (first node index, node count) within the allocation."""
        out, start = {}, 0
        for name, pool in self.node_pools.items():
            out[name] = (start, pool.nodes)
            start += pool.nodes
        return out


class ResumeConfig(_Strict):
    """How a requeued or resubmitted job resumes: attempts and total walltime."""

    max_retries: int = 3
    max_walltime: str | None = None


class BenchmarkRunConfig(_Strict):
    """One benchmark (one Slurm job): ``run`` is ``gym eval run``'s arguments; ``command`` replaces it."""

    prepare: dict[str, Any] = {}
    run: dict[str, Any] = {}
    command: str | None = None
    resumable: bool | ResumeConfig = False

    @property
    def resume_config(self) -> ResumeConfig | None:
        """The resume settings, or None when the benchmark is not resumable."""
        if self.resumable is False:
            return None
        return ResumeConfig() if self.resumable is True else self.resumable

    @model_validator(mode="after")
    def _one_of(self) -> BenchmarkRunConfig:
        if self.command is not None and self.run:
            raise ValueError(
                "a benchmark sets both command and run; run configures gym eval run, which command replaces"
            )
        return self


class GymInstallConfig(_Strict):
    """Which Gym a container driver installs (container mode only)."""

    repo: str = "https://github.com/NVIDIA-NeMo/gym"
    ref: str


class DriverConfig(_Strict):
    """The collection: where it runs, which policy it reaches, its benchmarks."""

    container: str | None = None
    gym_install: GymInstallConfig | None = None
    policy_model: str | None = None
    policy_host: str = "localhost"
    policy_model_type: str = "openai_model"
    benchmarks: dict[str, BenchmarkRunConfig]
    env: dict[str, str] = {}
    mounts: list[str] = []

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return resolve_env(value)


class JobConfig(_Strict):
    """Where a submission's run directory is made."""

    output_path: str


class OtelConfig(_Strict):
    """An OpenTelemetry collector beside the job (rendered only when ``endpoint`` is set here)."""

    enabled: bool = True
    binary: str = "otelcol-contrib"
    container: str | None = None
    endpoint: str | None = None
    token_env: str = "OTEL_TOKEN"
    service_name: str | None = None
    component: str = "gym-vllm"
    gym_telemetry: bool = True
    gym_span_groups: str = "default,verify"
    gym_logs: bool = True
    gpu_metrics_port: int | None = 9400
    node_metrics_port: int | None = 9100
    scrape_interval_seconds: int = Field(default=15, ge=1)
    health_check_timeout_seconds: int = Field(default=300, ge=1)


class SubmitConfig(_Strict):
    """The whole submit config (validated as a unit: placements, pools and the policy service)."""

    services: dict[str, ServiceConfig] = {}
    compute: dict[str, SlurmComputeConfig]
    driver: DriverConfig
    job: JobConfig
    otel: OtelConfig = OtelConfig()

    @model_validator(mode="before")
    @classmethod
    def _refuse_pd(cls, data: Any) -> Any:
        for name, service in (data.get("services") or {}).items() if isinstance(data, dict) else ():
            if isinstance(service, dict) and service.get("type") == "vllm_pd":
                raise ValueError(f"services.{name}: vllm_pd (prefill/decode split) is not supported here")
        return data

    @model_validator(mode="after")
    def _placements(self) -> SubmitConfig:
        if len(self.compute) != 1:
            raise ValueError(
                f"exactly one compute resource is supported, got {sorted(self.compute) or 'none'}"
            )
        (cluster,) = self.compute
        pools = set(self.compute[cluster].node_pools)
        for name, service in self.services.items():
            if service.placement is None:
                service.placement = cluster
            elif service.placement != cluster:
                raise ValueError(
                    f"services.{name}.placement {service.placement!r} is not a compute ({cluster!r})"
                )
            wanted = service.node_pools if isinstance(service, RayServiceConfig) else [service.node_pool]
            unknown = [p for p in wanted if p is not None and p not in pools]
            if unknown:
                raise ValueError(
                    f"services.{name} names node pool(s) {unknown}, not among compute.{cluster}.node_pools "
                    f"({', '.join(sorted(pools)) or 'none declared'})"
                )
        if self.driver.policy_model is not None:
            policy = self.services.get(self.driver.policy_model)
            if policy is None:
                raise ValueError(f"driver.policy_model {self.driver.policy_model!r} is not a service")
            if isinstance(policy, VllmServiceConfig):
                for bench, benchmark in self.driver.benchmarks.items():
                    taken = [
                        k
                        for k in ("policy_base_url", "policy_model_name", "policy_api_key")
                        if k in benchmark.run
                    ]
                    if taken:
                        raise ValueError(
                            f"benchmark {bench!r} sets {taken} and driver.policy_model is set: remove one"
                        )
                    benchmark.run["policy_base_url"] = f"http://{self.driver.policy_host}:{policy.port}/v1"
                    benchmark.run["policy_model_name"] = policy.served_model_name or policy.model
                    benchmark.run["policy_api_key"] = "dummy"
        bad = [n for n in self.driver.benchmarks if not re.fullmatch(r"[A-Za-z0-9._-]+", n)]
        if bad:
            raise ValueError(f"benchmark names {bad} may use only letters, digits, '.', '_' and '-'")
        return self

    @property
    def cluster(self) -> str:
        """The compute resource's name."""
        return next(iter(self.compute))

    @property
    def slurm(self) -> SlurmComputeConfig:
        """The one compute resource."""
        return self.compute[self.cluster]

    def ray_service(self) -> tuple[str, RayServiceConfig] | None:
        """The Ray service the stack is placed on, if any (at most one)."""
        found = [(n, s) for n, s in self.services.items() if isinstance(s, RayServiceConfig)]
        if len(found) > 1:
            raise ValueError(f"at most one ray service is supported, got {[n for n, _ in found]}")
        return found[0] if found else None
