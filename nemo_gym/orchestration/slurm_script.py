"""The batch script of one benchmark: services, the stack spread over the allocation, the collection.

Layout of the script, top to bottom: ``#SBATCH`` directives (``--requeue`` for a resumable
benchmark, logs appended across restarts); the resume guard (restart count and accumulated
walltime against ``resumable``'s limits); node names and addresses of the allocation; each
service as a background ``srun`` step (a Ray head on the first node of its pools and a worker on
every other node, vLLM servers); health checks; the driver: ``gym eval run`` with
``+resume_from_cache=true`` always (a requeued job finishes what the killed one left), its head
server on the driver node's address on a port the kernel picks (never a fixed port that a
trainer could hold), and, with a Ray service, the stack's servers placed on the Ray cluster.
Services are stopped when the driver ends; the job exits with the driver's status.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from nemo_gym.launch.config import project_root
from nemo_gym.orchestration.api import (
    RUNTIME_PREFIX,
    BenchmarkRunConfig,
    RayServiceConfig,
    SubmitConfig,
    VllmServiceConfig,
)

JOB_SCRIPT_NAME = "job.sh"
RESULTS_NAME = "artifacts/rollouts.jsonl"


def _walltime_seconds(text: str) -> int:
    """Slurm's duration spellings (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in seconds."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if not (1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)) or (days and not days.isdigit()):
        raise ValueError(
            f"invalid walltime {text!r}: expected Slurm's syntax, e.g. '48:00:00' or '2-00:00:00'"
        )
    values = [int(p) for p in parts]
    if days:
        h, m, s = (values + [0, 0])[:3]
    else:
        h, m, s = {1: [0, values[0], 0], 2: [0, *values], 3: values}[len(values)]
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def override_args(run: dict[str, Any]) -> list[str]:
    """``gym eval run`` arguments for a benchmark's ``run`` mapping: ``+key=value`` each (lists as
    ``[a,b]``, mappings as JSON), a key already written with ``+``/``++`` kept as it is."""
    out = []
    for key, value in run.items():
        if isinstance(value, bool):
            text = str(value).lower()
        elif isinstance(value, list | tuple):
            text = "[" + ",".join(str(v) for v in value) + "]"
        elif isinstance(value, dict):
            text = json.dumps(value, separators=(",", ":"))
        else:
            text = str(value)
        out.append(f"{key if key.startswith('+') else '+' + key}={text}")
    return out


def _env_exports(env: dict[str, str]) -> list[str]:
    lines = []
    for key, value in env.items():
        if value.startswith(RUNTIME_PREFIX):
            lines.append(f'export {key}="${{{value[len(RUNTIME_PREFIX) :]}}}"')
        else:
            lines.append(f"export {key}={shlex.quote(value)}")
    return lines


def _directives(config: SubmitConfig, name: str, bench_dir: Path, resumable: bool) -> list[str]:
    compute = config.slurm
    lines = [
        f"#SBATCH --job-name=gym-{name}",
        f"#SBATCH --account={compute.account}",
        f"#SBATCH --chdir={bench_dir}",
        f"#SBATCH --output={bench_dir}/logs/job-%j.log",
        "#SBATCH --open-mode=append",
    ]
    if compute.walltime:
        lines.append(f"#SBATCH --time={compute.walltime}")
    pools = list(compute.node_pools.values())
    if pools:
        partitions = sorted({p.partition for p in pools})
        lines.append(f"#SBATCH --partition={','.join(partitions)}")
        lines.append(f"#SBATCH --nodes={compute.total_nodes}")
        lines.append(f"#SBATCH --ntasks-per-node={max(p.ntasks_per_node for p in pools)}")
        gpus = [p.gpus_per_node for p in pools if p.gpus_per_node]
        if gpus:
            lines.append(f"#SBATCH --gpus-per-node={max(gpus)}")
        for pool in pools:
            lines += [f"#SBATCH --{k}={v}" for k, v in pool.extra_args.items()]
    if resumable:
        lines.append("#SBATCH --requeue")
    lines += [f"#SBATCH --{k}={v}" for k, v in compute.extra_args.items()]
    return lines


def _resume_guard(benchmark: BenchmarkRunConfig) -> list[str]:
    resume = benchmark.resume_config
    if resume is None:
        return []
    lines = [
        "# resumable: a requeued job runs this script again; give up past the limits",
        "if (( ${SLURM_RESTART_COUNT:-0} > " + str(resume.max_retries) + " )); then",
        f'  echo "gym: restart ${{SLURM_RESTART_COUNT}} is past max_retries={resume.max_retries}; stopping"; exit 1',
        "fi",
    ]
    if resume.max_walltime:
        cap = _walltime_seconds(resume.max_walltime)
        lines += [
            "_gym_spent=$(cat .gym_accumulated_walltime 2>/dev/null || echo 0)",
            f"if (( _gym_spent >= {cap} )); then",
            f'  echo "gym: ${{_gym_spent}}s spent, max_walltime={resume.max_walltime}; stopping"; exit 0',
            "fi",
            "trap 'echo $(( _gym_spent + SECONDS )) > .gym_accumulated_walltime' EXIT",
        ]
    return lines


def _srun(
    node: str, log: str, command: str, container: str | None, mounts: list[str], chdir: str | None = None
) -> str:
    flags = f'--overlap --nodes=1 --ntasks=1 --nodelist="{node}" --output={log} --open-mode=append'
    if chdir:
        flags += f" --chdir={shlex.quote(chdir)}"
    if container:
        flags += f" --container-image={shlex.quote(container)}"
        if mounts:
            flags += " --container-mounts=" + ",".join(shlex.quote(m) for m in mounts)
    return f"srun {flags} {command}"


def _ray_lines(name: str, service: RayServiceConfig, config: SubmitConfig, ray_bin: str) -> list[str]:
    offsets = config.slurm.pool_offsets()
    pools = service.node_pools or list(offsets) or [""]
    nodes: list[tuple[int, str]] = []  # (node index, pool)
    for pool in pools:
        start, count = offsets.get(pool, (0, config.slurm.total_nodes))
        nodes += [(start + i, pool) for i in range(count)]
    head_index = nodes[0][0]
    tmp = "/tmp/ngray-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}"
    common = f"--block --temp-dir={tmp} --disable-usage-stats"
    if service.num_cpus is not None:
        common += f" --num-cpus={service.num_cpus}"
    if service.num_gpus is not None:
        common += f" --num-gpus={service.num_gpus}"
    if service.extra_args:
        common += " " + service.extra_args
    lines = [f"# service {name}: a Ray cluster over node(s) {[i for i, _ in nodes]}"]
    lines += _env_exports(service.env)
    if service.pre_command:
        lines.append(service.pre_command)
    lines.append(f'gym_ray_address="${{gym_addrs[{head_index}]}}:{service.port}"')
    for index, pool in nodes:
        resources = service.resources.get(pool, {})
        res = f" --resources={shlex.quote(json.dumps(resources))}" if resources else ""
        addr = f'--node-ip-address="${{gym_addrs[{index}]}}"'
        role = (
            f"--head --port={service.port} --include-dashboard=false"
            if index == head_index
            else '--address="$gym_ray_address"'
        )
        cmd = f"{ray_bin} start {role} {addr} {common}{res}"
        lines.append(
            _srun(
                f"${{gym_nodes[{index}]}}",
                f"logs/{name}-{index}-%j.log",
                cmd,
                service.container,
                service.mounts,
            )
            + " &"
        )
        if index == head_index:
            lines.append(f'gym_wait_tcp "${{gym_addrs[{index}]}}" {service.port} 120 "{name} head"')
    waiter = (
        "import ray,sys,time; ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "end=time.time()+float(sys.argv[3]); n=int(sys.argv[2])\n"
        "while sum(x['Alive'] for x in ray.nodes())<n and time.time()<end: time.sleep(0.5)\n"
        "sys.exit(0 if sum(x['Alive'] for x in ray.nodes())>=n else 1)"
    )
    lines.append(
        f'{shlex.quote(sys.executable)} -c {shlex.quote(waiter)} "$gym_ray_address" {len(nodes)} 180 '
        f'|| {{ echo "gym: Ray service {name}: not all {len(nodes)} nodes joined"; gym_stop 1; }}'
    )
    return lines


def _vllm_lines(name: str, service: VllmServiceConfig, config: SubmitConfig) -> list[str]:
    offsets = config.slurm.pool_offsets()
    start, count = offsets.get(service.node_pool or "", (0, 1))
    flags = f"--port {service.port} --tensor-parallel-size {service.tensor_parallel_size}"
    flags += f" --pipeline-parallel-size {service.pipeline_parallel_size}"
    if service.served_model_name:
        flags += f" --served-model-name {shlex.quote(service.served_model_name)}"
    if service.trust_remote_code:
        flags += " --trust-remote-code"
    if service.extra_args:
        flags += " " + service.extra_args
    lines = [f"# service {name}: vllm serve on node {start}"] + _env_exports(service.env)
    if service.pre_command:
        lines.append(service.pre_command)
    cmd = f"vllm serve {shlex.quote(service.model)} {flags}"
    lines.append(
        _srun(f"${{gym_nodes[{start}]}}", f"logs/{name}-%j.log", cmd, service.container, service.mounts)
        + " &"
    )
    health = service.health_check
    if health is not None:
        lines.append(
            f'gym_wait_http "http://${{gym_addrs[{start}]}}:{health.port}{health.path}" '
            f'{health.timeout_seconds} "{name}"'
        )
    del count
    return lines


_PRELUDE = r"""set -uo pipefail
mkdir -p logs artifacts
echo "$SLURM_JOB_ID" >> .gym_job_chain
echo "gym: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST at $(date -u +%FT%TZ)"
mapfile -t gym_nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
gym_addrs=()
for gym_node in "${gym_nodes[@]}"; do
  gym_addrs+=("$(scontrol show node "$gym_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)")
done
export NEMO_GYM_AUTH_TOKEN="${NEMO_GYM_AUTH_TOKEN:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
# Ray's own token authentication, with a token of this job (every step inherits it): nobody else
# on the cluster's network can submit work to the job's Ray cluster.
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
gym_stop() {
  local pids; pids=$(jobs -p)
  [ -n "$pids" ] && kill $pids 2>/dev/null
  wait 2>/dev/null
  exit "$1"
}
trap 'gym_stop 143' TERM
gym_wait_tcp() {  # host port timeout name
  local end=$((SECONDS + $3))
  until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
    (( SECONDS < end )) || { echo "gym: $4 did not listen on $1:$2 within $3s"; gym_stop 1; }
    sleep 0.5
  done
}
gym_wait_http() {  # url timeout name
  local end=$((SECONDS + $2))
  until curl -fs -o /dev/null "$1"; do
    (( SECONDS < end )) || { echo "gym: $3 not healthy at $1 within $2s"; gym_stop 1; }
    sleep 2
  done
}"""


def build_sbatch_script(config: SubmitConfig, name: str, bench_dir: Path, gym_bin: str | None = None) -> str:
    """The whole batch script of benchmark ``name``, run in ``bench_dir``."""
    benchmark = config.driver.benchmarks[name]
    resumable = benchmark.resume_config is not None
    bin_dir = Path(sys.executable).parent
    gym = gym_bin or shlex.quote(str(bin_dir / "gym"))
    parts = ["#!/bin/bash", *_directives(config, name, bench_dir, resumable), "", _PRELUDE, ""]
    parts += _resume_guard(benchmark)
    ray = config.ray_service()
    for service_name, service in config.services.items():
        if isinstance(service, RayServiceConfig):
            parts += _ray_lines(service_name, service, config, shlex.quote(str(bin_dir / "ray")))
        else:
            parts += _vllm_lines(service_name, service, config)
    driver_index = 0
    if ray is not None:
        offsets = config.slurm.pool_offsets()
        first_pool = (ray[1].node_pools or list(offsets) or [""])[0]
        driver_index = offsets.get(first_pool, (0, 1))[0]
    parts += ["", "# the driver"] + _env_exports(config.driver.env)
    if benchmark.prepare:
        parts.append(
            f"{gym} eval prepare " + " ".join(shlex.quote(a) for a in override_args(benchmark.prepare))
        )
    if benchmark.command is not None:
        parts.append(f"export GYM_OUTPUT_JSONL={shlex.quote(str(bench_dir / RESULTS_NAME))}")
        driver = benchmark.command
    else:
        args = override_args(benchmark.run) + [
            f"+output_jsonl_fpath={bench_dir / RESULTS_NAME}",
            "+resume_from_cache=true",
            f'++head_server.host="${{gym_addrs[{driver_index}]}}"',
            "++head_server.port=0",
        ]
        if ray is not None:
            args += ['++ray_head_node_address="$gym_ray_address"', "++server_backend=ray"]
        driver = f"{gym} eval run " + " ".join(a if '"$' in a or '"${' in a else shlex.quote(a) for a in args)
    parts.append(
        _srun(
            f"${{gym_nodes[{driver_index}]}}",
            "logs/driver-%j.log",
            driver,
            config.driver.container,
            [*config.driver.mounts, f"{bench_dir}:{bench_dir}"],
            # On the host, relative paths of the run (configs, data) resolve from the project, as
            # NeMo Gym's driver resolves them from its checkout.
            chdir=None if config.driver.container else str(project_root()),
        )
    )
    parts += ["gym_rc=$?", 'echo "gym: driver exited $gym_rc"', "gym_stop $gym_rc", ""]
    return "\n".join(parts)
