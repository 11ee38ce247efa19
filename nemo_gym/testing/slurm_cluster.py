"""A real Slurm cluster of N nodes on this machine, for tests and benchmarks.

Each node is a ``slurmd`` in a network namespace of its own (a veth pair into a bridge in the
root namespace), so services on different nodes reach each other over addresses, as on a real
cluster; ``slurmctld`` and ``munged`` run in the root namespace. Addresses come from
198.18.0.0/24 (the range set aside for network testing), on hosts that exist only while the
cluster runs. Needs root, ``ip`` and Debian's ``slurmctld``/``slurmd``/``munge``;
:func:`unavailable_reason` says why not when it cannot run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "198.18.0"
CONTROLLER_ADDR = f"{SUBNET}.254"


def unavailable_reason() -> str | None:
    """None when a cluster can be started here, else why not (for a skip message)."""
    if os.geteuid() != 0:
        return "a Slurm cluster in network namespaces needs root"
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "ip", "nsenter"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is not installed (scripts/test.sh installs slurmctld slurmd slurm-client munge as root)"
    probe = subprocess.run(["ip", "netns", "add", "ngslprobe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "ngslprobe"], capture_output=True)
    return None


def _run(*argv: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, env=env)


@dataclass
class SlurmCluster:
    """A running cluster: ``env`` points Slurm's clients at it; ``stop()`` removes everything."""

    root: Path
    nodes: list[str]
    tag: str
    cpus_per_node: int = 2
    memory_mb: int = 8000
    env: dict[str, str] = field(default_factory=dict)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def node_addr(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def netns(self, index: int) -> str:
        return f"{self.tag}-{self.nodes[index]}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def start(self, timeout_s: float = 30.0) -> SlurmCluster:
        """Start munge, the network, slurmctld and one slurmd per node; wait until all are idle."""
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o711)
        key = self.root / "munge" / "munge.key"
        shutil.copyfile("/etc/munge/munge.key", key)
        key.chmod(0o600)
        sock = self.root / "munge" / "munge.socket"
        _run(
            "munged",
            "-S",
            str(sock),
            f"--key-file={key}",
            f"--log-file={self.root / 'log/munged.log'}",
            f"--pid-file={self.root / 'munge/munged.pid'}",
            f"--seed-file={self.root / 'munge/seed'}",
            "--force",
        )
        self._network()
        self.conf.write_text(self._conf_text(sock))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        _run("slurmctld", "-f", str(self.conf))
        for i, name in enumerate(self.nodes):
            (self.root / "spool" / f"slurmd-{name}").mkdir(parents=True, exist_ok=True)
            # nsenter enters the namespace's network only: ``ip netns exec`` would also remount /sys,
            # hiding the cgroup file system slurmd checks for at start.
            _run(
                "nsenter", f"--net=/var/run/netns/{self.netns(i)}", "slurmd", "-f", str(self.conf), "-N", name
            )
        deadline = time.monotonic() + timeout_s
        states: list[str] = []
        while time.monotonic() < deadline:
            states = _run("sinfo", "-h", "-N", "-o", "%N %T", check=False, env=self.env).stdout.split()
            if states and all(s == "idle" for s in states[1::2]) and len(states) == 2 * len(self.nodes):
                return self
            time.sleep(0.3)
        raise RuntimeError(f"Slurm nodes not idle after {timeout_s}s: {states}; logs in {self.root / 'log'}")

    def _network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{CONTROLLER_ADDR}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(len(self.nodes)):
            ns, host_end, ns_end = self.netns(i), f"{self.tag}h{i}", f"{self.tag}n{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            _run("ip", "link", "set", host_end, "master", self.bridge)
            _run("ip", "link", "set", host_end, "up")
            _run("ip", "link", "set", ns_end, "netns", ns)
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.node_addr(i)}/24", "dev", ns_end)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def _conf_text(self, sock: Path) -> str:
        r = self.root
        lines = [
            f"ClusterName={self.tag}",
            f"SlurmctldHost=localhost({CONTROLLER_ADDR})",
            "SlurmctldPort=16817",
            "SlurmdPort=16818",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
            f"AuthInfo=socket={sock},cred_expire=10",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/slurmd-%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log/slurmctld.log'}",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=1000",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r / 'log/jobcomp.txt'}",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1",
            "MinJobAge=300",
            "KillWait=5",
            "JobRequeue=1",
        ]
        for i, name in enumerate(self.nodes):
            lines.append(
                f"NodeName={name} NodeAddr={self.node_addr(i)} CPUs={self.cpus_per_node} "
                f"RealMemory={self.memory_mb} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP"
        )
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        """Shut Slurm and munge down, kill what jobs left behind, remove namespaces and links."""
        _run("scontrol", "-f", str(self.conf), "shutdown", check=False)
        time.sleep(0.5)
        for i in range(len(self.nodes)):
            ns = self.netns(i)
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        _run("munged", "-S", str(self.root / "munge/munge.socket"), "--stop", check=False)
        for pid_file in self.root.glob("*.pid"):
            try:
                os.kill(int(pid_file.read_text().strip()), 9)
            except (ProcessLookupError, ValueError, OSError):
                pass


def start_cluster(root: Path, nodes: int = 2, tag: str = "ngsl") -> SlurmCluster:
    """Start a cluster of ``nodes`` nodes under ``root`` (state, logs, config)."""
    cluster = SlurmCluster(root=root, nodes=[f"n{i + 1}" for i in range(nodes)], tag=tag)
    try:
        return cluster.start()
    except BaseException:
        cluster.stop()
        raise
