"""A real Slurm for the tests: munged, slurmctld and slurmd on one node, or two slurmd nodes
on this machine, each in a network namespace of its own (running_two_node_cluster).

Debian's slurm-wlm and munge packages (installed by .ci/install-slurm, which
`make test` runs first). The cluster gets a generated slurm.conf in a temp dir
with its own ports, proctrack/linuxproc, task/none and no accounting storage;
the client commands (sbatch, squeue, scontrol, scancel) find it through
SLURM_CONF, so the system's /etc/slurm is never read or written. The daemons
run in the foreground as children of the test process and are stopped by pid.

munged must run as the munge user with /run/munge, /var/log/munge,
/var/lib/munge and /etc/munge owned by it; a munged already answering on the
default socket is used as it is (and left running).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MUNGE_DIRS = ("/run/munge", "/var/log/munge", "/var/lib/munge", "/etc/munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
PARTITION = "debug"
# More CPUs than a small test machine has, so that several one-CPU jobs run at
# once (slurmd accepts it with SlurmdParameters=config_overrides).
NODE_CPUS = 8


@dataclass
class SlurmCluster:
    conf: Path
    partition: str
    node: str
    env: dict[str, str]  # what the client commands need (SLURM_CONF)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _munge_works() -> bool:
    if not shutil.which("munge"):
        return False
    made = subprocess.run(["munge", "-n"], capture_output=True)
    if made.returncode != 0:
        return False
    return subprocess.run(["unmunge"], input=made.stdout, capture_output=True).returncode == 0


def _start_munged() -> subprocess.Popen | None:
    """munged as the munge user, or None when one already answers."""
    if _munge_works():
        return None
    user = pwd.getpwnam("munge")
    for directory in MUNGE_DIRS:
        os.makedirs(directory, exist_ok=True)
        os.chown(directory, user.pw_uid, user.pw_gid)
    os.chmod("/run/munge", 0o755)  # clients reach the socket through it
    if not MUNGE_KEY.exists():
        subprocess.run(["mungekey", "--create", f"--keyfile={MUNGE_KEY}"], check=True,
                       user=user.pw_uid, group=user.pw_gid, extra_groups=[])
    proc = subprocess.Popen(["munged", "--foreground"], user=user.pw_uid, group=user.pw_gid,
                            extra_groups=[], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for(_munge_works, 20, "munged", proc)
    return proc


def _wait_for(ready, seconds: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}: {err[-2000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {seconds:g}s")


@contextmanager
def short_spool() -> Iterator[Path]:
    """slurmd's spool dir, short: slurmstepd makes a Unix socket per step in it, whose path
    must fit 108 bytes, and a pytest temp dir (deeper under xdist) may not leave room."""
    spool = Path(tempfile.mkdtemp(prefix="bp-spool-"))
    try:
        yield spool
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def write_conf(root: Path, node: str, spool: Path) -> Path:
    for sub in ("state", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=bptest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={spool}
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=300
KillWait=5
InactiveLimit=0
NodeName={node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _node_idle(env: dict[str, str], node: str) -> bool:
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], env=env,
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def _outside_any_allocation() -> Iterator[None]:
    """SLURM_JOB_ID unset meanwhile: tests started inside an allocation of another cluster
    (a CI runner under salloc) would otherwise make the tool run steps of it here."""
    held = os.environ.pop("SLURM_JOB_ID", None)
    try:
        yield
    finally:
        if held is not None:
            os.environ["SLURM_JOB_ID"] = held


@contextmanager
def running_cluster(root: Path) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd with a slurm.conf under root; SLURM_CONF set meanwhile."""
    with _outside_any_allocation(), short_spool() as spool, _running_cluster(root, spool) as cluster:
        yield cluster


@contextmanager
def _running_cluster(root: Path, spool: Path) -> Iterator[SlurmCluster]:
    for program in ("sbatch", "slurmctld", "slurmd", "munged"):
        if shutil.which(program) is None:
            raise RuntimeError(f"{program} not found: run .ci/install-slurm (make test does)")
    node = socket.gethostname().split(".")[0]
    conf = write_conf(root, node, spool)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munged = slurmctld = slurmd = None
    old_conf = os.environ.get("SLURM_CONF")
    try:
        munged = _start_munged()
        slurmctld = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_for(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True,
                                         text=True).stdout.count("UP") > 0,
                  60, "slurmctld", slurmctld)
        slurmd = subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", node], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_for(lambda: _node_idle(env, node), 60, "slurmd (node idle)", slurmd)
        os.environ["SLURM_CONF"] = str(conf)
        yield SlurmCluster(conf=conf, partition=PARTITION, node=node,
                           env={"SLURM_CONF": str(conf)})
    finally:
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
        if slurmctld is not None and slurmctld.poll() is None:
            subprocess.run(["scancel", "--full", "--partition", PARTITION], env=env,
                           capture_output=True, timeout=30)
        _stop(slurmd)
        _stop(slurmctld)
        _stop(munged)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running single-node Slurm for the whole test session (SLURM_CONF set)."""
    with running_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


# -- two nodes on one machine: each slurmd in a network namespace of its own ------------
NODES = ("bpnode1", "bpnode2")  # host names inside the namespaces (their own UTS namespace)


@dataclass
class TwoNodeCluster:
    conf: Path
    partition: str
    nodes: tuple[str, str]
    addresses: tuple[str, str]
    namespaces: tuple[str, str]
    env: dict[str, str]  # SLURM_CONF
    daemons: list[subprocess.Popen] = field(default_factory=list)  # stopped by pid at the end

    def inside(self, argv: list[str], node: int = 0) -> list[str]:
        """argv run in a node's network namespace, with that node's host name (the
        controller and the clients live on the first node)."""
        # Not `ip netns exec`: it remounts /sys, and slurmd needs the cgroup filesystem there.
        ns = self.namespaces[node]
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts", "sh", "-c",
                f'mount --bind /etc/netns/{ns}/hosts /etc/hosts && hostname {self.nodes[node]} '
                '&& exec "$@"', "sh", *argv]


    def kill_node(self, node: int) -> list[int]:
        """The node dies: SIGKILL to every process of its network namespace (its slurmd, the
        slurmstepd of each step and the steps' tasks). Returns their pids."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespaces[node]],
                                capture_output=True, text=True, check=True)
        pids = [int(pid) for pid in listed.stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def start_slurmd(self, node: int) -> None:
        """A new slurmd for a node whose slurmd was killed; returns once the node is idle."""
        env = {**os.environ, **self.env}
        proc = subprocess.Popen(
            self.inside(["slurmd", "-D", "-f", str(self.conf), "-N", self.nodes[node]], node=node),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.daemons.append(proc)
        _wait_for(lambda: _node_idle_inside(self, env, self.nodes[node]), 60,
                  f"slurmd of {self.nodes[node]} (node idle)", proc)


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)} failed: {done.stderr.strip()} "
                           "(the two-node Slurm needs root with CAP_NET_ADMIN: network namespaces "
                           "and a veth pair between them)")


def write_two_node_conf(root: Path, addresses: tuple[str, str], spool: Path,
                        slurmd_timeout_s: int | None = None) -> Path:
    for sub in ("state", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs={NODE_CPUS} State=UNKNOWN"
                      for n, a in zip(NODES, addresses, strict=True))
    # Ports are those of the namespaces, where nothing else listens.
    conf.write_text(f"""\
ClusterName=bptwo
SlurmctldHost={NODES[0]}({addresses[0]})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={spool}/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=300
KillWait=5
InactiveLimit=0
{f"SlurmdTimeout={slurmd_timeout_s}" if slurmd_timeout_s else ""}
{nodes}
PartitionName={PARTITION} Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


@contextmanager
def running_two_node_cluster(root: Path, *,
                             slurmd_timeout_s: int | None = None) -> Iterator[TwoNodeCluster]:
    """munged (shared through its socket's path), slurmctld and one slurmd per node, each node
    a network namespace joined to the other by a veth pair on a private /24 that only these
    two namespaces hold. Everything is started here and stopped by pid; the namespaces, the
    veth pair and their /etc/netns host files are removed. slurmd_timeout_s: how soon the
    controller calls a node that stopped answering failed (Slurm's default is 300 s)."""
    with (_outside_any_allocation(), short_spool() as spool,
          _running_two_node_cluster(root, spool, slurmd_timeout_s) as cluster):
        yield cluster


@contextmanager
def _running_two_node_cluster(root: Path, spool: Path,
                              slurmd_timeout_s: int | None) -> Iterator[TwoNodeCluster]:
    for program in ("sbatch", "slurmctld", "slurmd", "munged", "ip", "unshare", "nsenter"):
        if shutil.which(program) is None:
            raise RuntimeError(f"{program} not found: run .ci/install-slurm (make test does)")
    tag = f"bp{os.getpid() % 100000}"
    namespaces = (f"{tag}a", f"{tag}b")
    subnet = f"10.231.{os.getpid() % 250}"
    addresses = (f"{subnet}.1", f"{subnet}.2")
    conf = write_two_node_conf(root, addresses, spool, slurmd_timeout_s)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    made: list[str] = []
    hosts_dirs = [Path("/etc/netns") / ns for ns in namespaces]
    procs: list[subprocess.Popen] = []  # the cluster's daemons: start_slurmd adds to them
    munged = None
    try:
        for ns in namespaces:
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", f"{tag}va", "netns", namespaces[0], "type", "veth",
            "peer", "name", f"{tag}vb", "netns", namespaces[1])
        for ns, dev, address in zip(namespaces, (f"{tag}va", f"{tag}vb"), addresses, strict=True):
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{a} {n}\n" for n, a in zip(NODES, addresses, strict=True))
        for directory in hosts_dirs:  # bound over /etc/hosts inside (TwoNodeCluster.inside)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text(hosts)
        cluster = TwoNodeCluster(conf=conf, partition=PARTITION, nodes=NODES, addresses=addresses,
                                 namespaces=namespaces, env={"SLURM_CONF": str(conf)}, daemons=procs)
        munged = _start_munged()
        slurmctld = subprocess.Popen(cluster.inside(["slurmctld", "-D", "-i", "-f", str(conf)]),
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(slurmctld)
        _wait_for(lambda: subprocess.run(cluster.inside(["scontrol", "ping"]), env=env,
                                         capture_output=True, text=True).stdout.count("UP") > 0,
                  60, "slurmctld", slurmctld)
        for k, node in enumerate(NODES):
            (spool / node).mkdir(parents=True, exist_ok=True)
            procs.append(subprocess.Popen(
                cluster.inside(["slurmd", "-D", "-f", str(conf), "-N", node], node=k), env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for node, proc in zip(NODES, procs[1:], strict=True):
            _wait_for(lambda node=node: _node_idle_inside(cluster, env, node), 60,
                      f"slurmd of {node} (node idle)", proc)
        yield cluster
    finally:
        if procs and procs[0].poll() is None:
            subprocess.run(TwoNodeCluster.inside(cluster, ["scancel", "--full", "--partition", PARTITION]),
                           env=env, capture_output=True, timeout=30)
        for proc in reversed(procs):
            _stop(proc)
        _stop(munged)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # the veth pair goes with it
        for directory in hosts_dirs:
            shutil.rmtree(directory, ignore_errors=True)


def _node_idle_inside(cluster: TwoNodeCluster, env: dict[str, str], node: str) -> bool:
    out = subprocess.run(cluster.inside(["sinfo", "-h", "-n", node, "-o", "%t"]), env=env,
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc")
