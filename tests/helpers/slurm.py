"""A single-node Slurm cluster on 127.0.0.1 for the tests, from Debian's packages (``slurm-wlm``,
``munge``): ``with slurm_cluster(tmp) as cluster`` writes its configuration into ``tmp`` (a munge
key, ``slurm.conf`` with this machine's hostname, CPUs and memory, free ports), starts ``munged``,
``slurmctld`` and ``slurmd`` in the foreground as children of the test, waits until the node is
idle, and on exit cancels every job left and stops the three daemons. ``cluster.env`` is what
``sbatch``, ``squeue`` and ``scontrol`` need (``SLURM_CONF``).

``missing()`` says why a cluster cannot be brought up here (the packages are not installed, or the
tests do not run as root, which slurmd needs to start jobs as the submitting user): tests skip with
that reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .servers import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def missing() -> str | None:
    """Why a cluster cannot be brought up here, or None."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install -y slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a Slurm node runs jobs as their user through slurmd, which must run as root"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Cluster:
    """A running single-node cluster: its folder ``root``, ``env`` for the client commands, the
    ``node`` name."""

    root: Path
    env: dict[str, str]
    node: str

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command (``sbatch``, ``squeue``, ...) against this cluster (``env`` added
        to its environment: ``sbatch --export=ALL`` passes it on to the job); raises on failure,
        with its message."""
        done = subprocess.run(
            [_which(args[0]), *args[1:]],
            env={**self.env, **(env or {}), "SLURM_CONF": self.env["SLURM_CONF"]},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr}")
        return done

    def states(self, job: str) -> dict[str, str]:
        """Each task of job ``job`` (``123`` or ``123_4``) -> its state (RUNNING, COMPLETED, FAILED,
        ...), the finished ones included (``scontrol show job``; the controller keeps them for
        ``MinJobAge``)."""
        out = subprocess.run(
            [_which("scontrol"), "-o", "show", "job", job],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        states = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            task = fields.get("ArrayTaskId")
            name = (
                f"{fields.get('ArrayJobId', fields.get('JobId'))}_{task}"
                if task
                else fields.get("JobId", "")
            )
            states[name] = fields.get("JobState", "")
        return states

    def wait(self, job: str, timeout: float = 300) -> dict[str, str]:
        """Until every task of ``job`` has ended; their states."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states(job)
            if states and all(
                s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
                for s in states.values()
            ):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still running after {timeout:g} s: {states}")
            time.sleep(0.5)


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return (
                int(line.split()[1]) // 1024 * 9 // 10
            )  # below what slurmd finds, or the node is drained
    return 1024


@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[Cluster]:
    """Bring up munged, slurmctld and slurmd in ``root`` (see the module docstring); stop them on
    exit."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)  # munged refuses folders others can write to
    for sub in ("state", "spool", "logs"):
        (root / sub).mkdir(exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    node = socket.gethostname()
    conf = root / "slurm.conf"
    conf.write_text(f"""# a single-node cluster for dxi's tests (tests/helpers/slurm.py)
ClusterName=dxitest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/logs/slurmctld.log
SlurmdLogFile={root}/logs/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
SlurmdTimeout=30
InactiveLimit=0
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={_memory_mb()} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    _which("munged"),
                    "--foreground",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={root}/munge.socket",
                    f"--pid-file={root}/munged.pid",
                    f"--log-file={root}/logs/munged.log",
                    f"--seed-file={root}/munge.seed",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        _until(lambda: (root / "munge.socket").exists(), 20, "munged did not start", root)
        procs.append(
            subprocess.Popen(
                [_which("slurmctld"), "-D", "-i", "-f", str(conf)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        procs.append(
            subprocess.Popen(
                [_which("slurmd"), "-D", "-f", str(conf)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        cluster = Cluster(root, env, node)

        def idle() -> bool:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited ({p.returncode}); see {root}/logs")
            out = subprocess.run(
                [_which("sinfo"), "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True
            )
            return out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated")

        _until(idle, 60, "the Slurm node did not come up", root)
        yield cluster
    finally:
        if procs:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [_which("scancel"), "--user", "root", "--full"],
                    env=env,
                    capture_output=True,
                    timeout=30,
                )
        for p in reversed(procs):  # slurmd, slurmctld, munged
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _until(ready, timeout: float, what: str, root: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text()[-2000:]}"
                for p in sorted((root / "logs").glob("*.log"))
            )
            raise RuntimeError(f"{what} within {timeout:g} s\n{logs}")
        time.sleep(0.2)
