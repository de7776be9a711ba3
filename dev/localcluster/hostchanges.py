"""What real nodes change on the machine, recorded before it is changed, undone after.

A real kubelet and containerd are not contained processes: they mount (overlay snapshots,
sandbox network namespaces, Secret volumes), make cgroups, bridges and veths, set sysctls
(the kubelet's kernel tunables: ``setupKernelTunables`` in
pkg/kubelet/cm/container_manager_linux.go; the bridge CNI plugin's ``net.ipv4.ip_forward``),
leave CNI result files in ``/var/lib/cni``, and their shims (``containerd-shim-runc-v2``)
daemonize, so they outlive a SIGKILLed parent.
A test session that crashes must not leave a machine that behaves differently.

So every real-node cluster writes a :class:`HostRecord` into :data:`RECORD_DIR` before it
changes anything: its owner's pid, its work directory, the bridges, cgroup roots and CNI
network names it will make, the nodes' network namespaces, and the sysctls' values before.
:func:`undo` takes all of it back and is what a clean stop runs; :func:`clean_stale` runs it
for every record whose owner is gone, at the next start. ``/run`` is a tmpfs: a reboot, which
undoes everything anyway, also forgets the records.

Sysctls are machine-wide and shared by every kubelet on it: they are restored only when no
other live record remains (the last cluster out puts them back).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from dev.localcluster import nodenet
from dev.localcluster.procs import cmdline, pid_alive

log = logging.getLogger(__name__)

RECORD_DIR: Final = Path(
    os.environ.get("KN_RESCHEDULER_HOST_RECORDS", "/run/kn-rescheduler/real-nodes")
)
CGROUP_FS: Final = Path("/sys/fs/cgroup")
CNI_RESULTS: Final = Path("/var/lib/cni/results")
# The sysctls a kubelet (protectKernelDefaults: false) or the bridge plugin (isGateway) may set.
SYSCTLS: Final = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
_MNT_DETACH: Final = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass(frozen=True)
class HostRecord:
    """What one real-node cluster may change on the machine (JSON in RECORD_DIR)."""

    owner_pid: int
    # The owner's start time (clock ticks since boot): a pid alone may be reused.
    owner_start: int
    workdir: str
    bridges: tuple[str, ...]
    cgroup_roots: tuple[str, ...]
    cni_networks: tuple[str, ...]
    runtime_sockets: tuple[str, ...]
    sysctls: Mapping[str, str] = field(default_factory=dict)
    # Machine-wide directories containerd makes if they are missing (its shims' sockets in
    # /run/containerd/s): removed at the end if they were absent before and are empty then.
    created_dirs: tuple[str, ...] = ()
    # The nodes' network namespaces (localcluster.nodenet), with everything running in them.
    netns: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return RECORD_DIR / f"{Path(self.workdir).name}-{self.owner_pid}.json"

    def write(self) -> None:
        RECORD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        tmp.replace(self.path)

    @classmethod
    def read(cls, path: Path) -> HostRecord | None:
        try:
            raw = json.loads(path.read_text())
            return cls(
                owner_pid=int(raw["owner_pid"]),
                owner_start=int(raw.get("owner_start", 0)),
                workdir=str(raw["workdir"]),
                bridges=tuple(raw.get("bridges", ())),
                cgroup_roots=tuple(raw.get("cgroup_roots", ())),
                cni_networks=tuple(raw.get("cni_networks", ())),
                runtime_sockets=tuple(raw.get("runtime_sockets", ())),
                sysctls=dict(raw.get("sysctls", {})),
                created_dirs=tuple(raw.get("created_dirs", ())),
                netns=tuple(raw.get("netns", ())),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


def records() -> list[HostRecord]:
    if not RECORD_DIR.is_dir():
        return []
    found = (HostRecord.read(p) for p in sorted(RECORD_DIR.glob("*.json")))
    return [r for r in found if r is not None]


def start_time(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    # Field 22, counted after the parenthesised command name (which may hold spaces).
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


def owner_alive(record: HostRecord) -> bool:
    return pid_alive(record.owner_pid) and start_time(record.owner_pid) == record.owner_start


def clean_stale() -> list[str]:
    """Undoes every record whose owner is gone (a crashed run); the work directories cleaned."""
    cleaned = []
    for record in records():
        if owner_alive(record):
            continue
        log.warning("cleaning what a crashed real-node cluster left: %s", record.workdir)
        undo(record)
        cleaned.append(record.workdir)
    return cleaned


# -- undoing -------------------------------------------------------------------------------------


def cgroup_dirs(root: str) -> Iterator[Path]:
    """Every cgroup directory under ``root`` in every v1 hierarchy (or the v2 one), deepest
    first."""
    rel = root.strip("/")
    if not rel:
        return
    bases = [p for p in CGROUP_FS.iterdir() if p.is_dir()] if CGROUP_FS.is_dir() else []
    if (CGROUP_FS / "cgroup.controllers").exists():
        bases = [CGROUP_FS]
    for base in bases:
        top = base / rel
        if not top.is_dir():
            continue
        dirs = [Path(d) for d, _, _ in os.walk(top)]
        yield from sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def make_cgroup(path: str) -> None:
    """Creates ``path`` (and its parents) in every cgroup hierarchy, as a kubelet's
    ``cgroupRoot`` must exist before it starts. A v1 cpuset cgroup starts with no CPUs and no
    memory nodes, so they are copied from its parent."""
    rel = path.strip("/")
    v2 = (CGROUP_FS / "cgroup.controllers").exists()
    bases = [CGROUP_FS] if v2 else [p for p in CGROUP_FS.iterdir() if p.is_dir()]
    for base in bases:
        current = base
        for part in Path(rel).parts:
            parent, current = current, current / part
            if current.is_dir():
                continue
            current.mkdir()
            if base.name == "cpuset" and not v2:
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (current / name).write_text((parent / name).read_text())


def pids_in_cgroups(roots: Sequence[str]) -> set[int]:
    pids: set[int] = set()
    for root in roots:
        for d in cgroup_dirs(root):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return pids


def shim_pids(sockets: Sequence[str]) -> set[int]:
    """containerd-shim processes serving one of ``sockets`` (``-address <socket>``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        args = cmdline(int(entry.name))
        if args and "containerd-shim" in Path(args[0]).name and any(s in args for s in sockets):
            found.add(int(entry.name))
    return found


def kill_all(pids: set[int], what: str) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if pid_alive(p)]
    if left:
        log.warning("%s still alive after SIGKILL: %s", what, left)


def mounts_under(directory: str) -> list[str]:
    """Mount points at or under ``directory`` in our mount namespace, deepest first."""
    d = directory.rstrip("/")
    points = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        # The kernel escapes spaces and the like in paths as octal (\040).
        point = fields[4].encode().decode("unicode_escape")
        if point == d or point.startswith(d + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def unmount_all(directory: str) -> None:
    # Mounts stack (a netns file bind-mounted twice); go round until none is left.
    for _ in range(5):
        points = mounts_under(directory)
        if not points:
            return
        for point in points:
            if _libc.umount2(point.encode(), _MNT_DETACH) != 0:
                err = ctypes.get_errno()
                log.warning("umount %s failed: %s", point, os.strerror(err))


def bridge_ports(bridge: str) -> list[str]:
    """The links enslaved to ``bridge`` (none if it is gone)."""
    try:
        return sorted(p.name for p in Path(f"/sys/class/net/{bridge}/brif").iterdir())
    except OSError:
        return []


def delete_link(name: str) -> None:
    nodenet.run_quietly(["ip", "link", "delete", name])


def restore_sysctls(values: Mapping[str, str]) -> None:
    for name, value in values.items():
        path = Path("/proc/sys") / name
        try:
            if path.read_text().strip() != value:
                path.write_text(value)
        except OSError as e:
            log.warning("could not restore sysctl %s=%s: %s", name, value, e)


def sandbox_ids(workdir: str) -> set[str]:
    """The pod sandboxes containerd's CRI plugin made under ``workdir`` (one directory each in
    its root), whose CNI results the CNI library keeps in /var/lib/cni/results."""
    pattern = "*/containerd/root/io.containerd.grpc.v1.cri/sandboxes/*"
    return {p.name for p in Path(workdir).glob(pattern)}


def shim_sockets(workdir: str) -> set[Path]:
    """The sockets of the shims of the runtimes under ``workdir``. containerd 1.6 puts them in
    the machine-wide /run/containerd/s, named by a hash of (its address, namespace, task id)
    (runtime/v2/shim/util_unix.go), and writes each one's address into the task's bundle; a
    shim killed by SIGKILL leaves its socket behind. A containerd still running deletes the
    bundle of a shim it sees die (its dead-shim cleanup), address file and all: read them
    before killing shims under a live containerd."""
    pattern = "*/containerd/state/io.containerd.runtime.v2.task/*/*/address"
    found = set()
    for address in Path(workdir).glob(pattern):
        with contextlib.suppress(OSError):
            path = Path(address.read_text().strip().removeprefix("unix://"))
            if path.parent == Path("/run/containerd/s"):
                found.add(path)
    return found


def undo(record: HostRecord, *, known_sockets: Iterable[Path] = ()) -> None:
    """Takes back everything ``record`` names; safe to run twice. ``known_sockets``: shim
    sockets found before the shims were killed (see shim_sockets)."""
    # Killed, not stopped through CRI, the sandboxes never get a CNI DEL: their results stay
    # in /var/lib/cni/results as <network>-<sandbox id>-<interface> (cni-loopback is the
    # loopback network containerd adds to every sandbox).
    sandboxes = sandbox_ids(record.workdir)
    sockets = shim_sockets(record.workdir) | set(known_sockets)
    # Containers first (their processes hold mounts and network namespaces), then the shims
    # that supervise them (daemonized: no parent of ours kills them).
    kill_all(pids_in_cgroups(record.cgroup_roots), "containers")
    kill_all(shim_pids(record.runtime_sockets), "containerd shims")
    # What a crashed owner left running in the nodes' namespaces (kubelets, kube-proxies).
    kill_all(set().union(*(nodenet.netns_pids(n) for n in record.netns)), "node processes")
    for path in [*sockets, *map(Path, record.runtime_sockets)]:
        path.unlink(missing_ok=True)
        Path(f"{path}.ttrpc").unlink(missing_ok=True)
    unmount_all(record.workdir)
    shutil.rmtree(record.workdir, ignore_errors=True)
    # The machine-side ends of the nodes' veths (the bridge's ports) are deleted by name: a
    # deleted netns takes its end of the pair down only when the kernel's namespace cleanup
    # runs, asynchronously, which a check right after may beat.
    ports = [port for bridge in record.bridges for port in bridge_ports(bridge)]
    for netns in record.netns:
        nodenet.delete_netns(netns)
    for port in ports:
        delete_link(port)
    for bridge in record.bridges:
        delete_link(bridge)
    for root in record.cgroup_roots:
        for d in cgroup_dirs(root):
            with contextlib.suppress(OSError):
                d.rmdir()
    if CNI_RESULTS.is_dir():
        for f in CNI_RESULTS.iterdir():
            if f.name.startswith(tuple(f"{n}-" for n in record.cni_networks)) or any(
                f"-{sandbox}-" in f.name for sandbox in sandboxes
            ):
                f.unlink(missing_ok=True)
    others = [r for r in records() if r.path != record.path and owner_alive(r)]
    if not others:
        restore_sysctls(record.sysctls)
        for directory in record.created_dirs:  # deepest first, as recorded
            with contextlib.suppress(OSError):
                Path(directory).rmdir()
    record.path.unlink(missing_ok=True)
