"""The fake kubelet: the only writer of pod status on the local cluster's kwok nodes.

kwok keeps the nodes alive (status, heartbeats, leases); this controller does what a kubelet
does for a pod from binding to removal. It watches pods bound to the cluster's nodes and, for
each new pod:

1. reads the pod's node as it was when the pod was bound (an exact-revision read at the pod's
   resourceVersion of that moment) and decides the pod's fate once: the node's
   ``sim.kn-rescheduler.io/fault`` label, or ``none``. A label set before the pod was bound is
   always seen, one changed afterwards never is, however late this controller gets to the pod.
   A pod carrying the same label itself (from its template) takes that fate on every node: an
   application broken wherever it runs, which no move can fix. The pod's own annotations add
   what no node fault gives (``podstatus.SIM_RUNS_FOR_ANNOTATION`` and the keys beside it): a
   container that runs a while before each crash, an exit code its ``restartPolicyRules``
   restart in place, a slow first pull of its image, a pod left terminal long ago; and a pod
   naming a Multus network attachment never gets its sandbox (the local cluster has none). The
   decision is stamped on the pod as the annotation of the same key;
2. writes the statuses a kubelet would write for that fate, step by step (``pods/status``
   strategic merge patches with a uid precondition, like the kubelet's status manager), and for
   crash loops keeps raising ``restartCount``: every ``restart_interval`` seconds on the
   default, compressed clock, or after a real kubelet's back-off (``Timing.real()``: 10 s, 20 s,
   40 s ... up to 5 min, jittered as the kubelet's pod worker does; see
   :func:`~localcluster.podstatus.on_exit`). Either way the CrashLoopBackOff message names the
   kubelet's back-off entry ("back-off 20s restarting failed container=..."), so a pod reads
   the same at each restart; only the time between restarts differs;
3. once the pod is deleted (a deletionTimestamp), stops it as a kubelet does: ``stop_after``
   seconds later its containers have exited (SIGTERM, exit 143) and it is written terminal
   (:func:`~localcluster.podstatus.terminated_status`: Failed, or Succeeded if every container
   exited 0), and only then is it removed for good, by a delete with grace period 0 and the
   pod's uid as precondition, as the kubelet's status manager does. Finalizers (the Job
   controller's ``batch.kubernetes.io/job-tracking``) hold it, terminal, until their owners
   remove them; the API server then removes it itself (its grace period is already 0).

A pod must be terminal before it goes: the Job controller, with a pod failure policy, replaces
a pod and releases its finalizer only once the pod is Failed or Succeeded.

Being the single writer of pod status (kwok has no pod status stages here) is what makes the
simulation race-free: no two controllers ever patch the same pod's status.

Work is sharded by pod uid over a few threads; each shard owns its pods' state, so the steps
of one pod never run concurrently or out of order.
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import logging
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from dev.localcluster import addresses
from dev.localcluster.keys import (
    SIM_FAULT_HITS_RUNNING_LABEL,
    SIM_FAULT_LABEL,
)
from dev.localcluster.podstatus import (
    FAULT_MODES,
    HEALTHY,
    JSON,
    KUBELET_BACK_OFF,
    SANDBOX_FATE,
    TERMINAL_FATE,
    TERMINAL_PHASES,
    BackOffPolicy,
    PodRun,
    Step,
    back_off_after,
    crash_exit_code,
    eviction_message,
    exit_code_of,
    go_duration_ms,
    is_job_pod,
    left_terminal,
    multus_networks,
    multus_sandbox_message,
    on_exit,
    pod_status,
    pull_takes,
    restart_delay,
    restarts_after_exit,
    runs_for,
    terminal_age,
    terminal_kind,
    terminated_status,
)
from dev.localcluster.rest import STRATEGIC_MERGE_PATCH, ApiError, Rest

# The pod annotation recording the fate decided at binding (same key as the node label).
FAULT_ANNOTATION: Final = SIM_FAULT_LABEL
_RETRY_DELAY: Final = 0.5
# Timer tokens of a deleted pod's two steps (the tokens of its life's steps count up from 0).
_STOP: Final = -1
_REMOVE: Final = -2
# A shard event: a node fault that hits the containers running there ({"node", "mode"}).
_FAULT: Final = "FAULT"
# The faults that make a running container exit (the others stop pods from starting).
_CRASHING_MODES: Final = frozenset({"crashloop", "oom"})
# The size the Pulled Event gives every image: about a small distroless application's.
_FAKE_IMAGE_SIZE: Final = 48_213_504


BackOffMode = Literal["compressed", "kubelet"]
BACK_OFF_MODES: Final[tuple[BackOffMode, ...]] = ("compressed", "kubelet")


@dataclass(frozen=True)
class Timing:
    """How fast simulated pods move (seconds). The default is a compressed clock;
    :meth:`real` restarts crash-looping containers as a real kubelet does."""

    # Binding -> containers started (or failing).
    start: float = 0.5
    # Crash loops: first crash -> restarted at once (the kubelet's next sync: its PLEG relists
    # every second) and crashed again, in CrashLoopBackOff; then one more restart every
    # restart_interval ("compressed"), or after the kubelet's back-off ("kubelet").
    first_restart: float = 0.5
    restart_interval: float = 3.0
    backoff: BackOffMode = "compressed"
    back_off_policy: BackOffPolicy = KUBELET_BACK_OFF
    # ErrImagePull -> ImagePullBackOff.
    pull_backoff: float = 2.0
    # A sandbox that cannot be created (a Multus attachment that does not exist): the kubelet
    # tries again, and records FailedCreatePodSandBox again, this often.
    sandbox_retry: float = 10.0
    # Running -> Evicted.
    evict_after: float = 2.0
    # Healthy pods of a Job complete after running this long.
    job_runtime: float = 2.0
    # A deleted pod's containers have exited this long after the deletion is seen; the pod is
    # then written terminal and removed at once. Its terminationGracePeriodSeconds is not
    # waited out: the simulated processes die of SIGTERM at once (exit 143), well inside any
    # grace period a kubelet grants (at least 2 s), so the grace period never matters.
    stop_after: float = 0.2

    def __post_init__(self) -> None:
        if self.backoff not in BACK_OFF_MODES:
            raise ValueError(f"unknown back-off {self.backoff!r}; known: {BACK_OFF_MODES}")

    @classmethod
    def real(cls) -> Timing:
        """Crash loops back off as kubelet v1.36's do (10 s doubling to 5 min, reset after a
        10-minute run, requeued with the pod worker's jitter); everything else as the default.
        The restart threshold of 3 is then about 30-45 s after the first failure, not 7 s."""
        return cls(backoff="kubelet")


# The functions' settings that go with this compressed clock. A real kubelet backs off 10s, 20s,
# 40s ... between attempts, and detect-failures waits for about three of them (30s) before it
# calls a failed image pull or container start a node failure; the fake kubelet retries in 2s,
# so the local stack, the tests and the demo wait 1s. Crash loops are credited no faster than
# the default back-off's pace (10 s, then doubling); the fake kubelet restarts every 3 s, so
# the pace is 1 s here. Everything else keeps its default.
LOCAL_FUNCTION_SETTINGS: Final = {
    "KN_RESCHEDULER_WAITING_FAILURE_AFTER": "1s",
    "KN_RESCHEDULER_CRASHLOOP_PACE": "1s",
}


@dataclass
class _Tracked:
    pod: JSON
    # The pod's resourceVersion when first seen bound: the revision its fate is read at.
    bound_rv: str = ""
    run: PodRun | None = None
    pod_ip: str = ""  # allocated once, even if admission is retried
    done: bool = False
    token: int = 0  # invalidates timers of earlier steps
    stopping: bool = False  # deleted: its stop is scheduled or done
    removal: str = ""  # "" | "pending" | "sent": the final delete (grace period 0)


def _rv(pod: JSON) -> int | None:
    try:
        return int(pod.get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return None


def _not_older(pod: JSON, than: JSON) -> bool:
    """Whether ``pod`` is at least as recent as ``than`` (a watch event may trail the response
    to this kubelet's own patch; resourceVersions are etcd revisions here)."""
    new, old = _rv(pod), _rv(than)
    return new is None or old is None or new >= old


class _IPAM:
    """Pod IPs from each node's podCIDR (lowest free host address)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: dict[str, set[str]] = {}

    def allocate(self, node: str, cidr: str) -> str:
        net = ipaddress.ip_network(cidr, strict=False)
        with self._lock:
            used = self._used.setdefault(node, set())
            for host in itertools.islice(net.hosts(), 1, None):  # .1 is the bridge
                ip = str(host)
                if ip not in used:
                    used.add(ip)
                    return ip
        return str(next(itertools.islice(net.hosts(), 1, None)))

    def release(self, node: str, ip: str) -> None:
        with self._lock:
            self._used.get(node, set()).discard(ip)


class _Shard:
    def __init__(self, kubelet: FakeKubelet, index: int) -> None:
        self.k = kubelet
        self.index = index
        self.cond = threading.Condition()
        self.events: list[tuple[str, JSON]] = []
        self.timers: list[tuple[float, int, str, int]] = []
        self.pods: dict[str, _Tracked] = {}
        # The pod worker's jitter (Timing.real()); one source per shard thread.
        self.rng = random.Random()
        self.thread = threading.Thread(target=self._loop, name=f"fake-kubelet-{index}", daemon=True)

    # -- called from the watch thread ------------------------------------------------------
    def put(self, kind: str, obj: JSON) -> None:
        with self.cond:
            self.events.append((kind, obj))
            self.cond.notify()

    # -- the shard's own thread --------------------------------------------------------------
    def _loop(self) -> None:
        while not self.k.stopped.is_set():
            event: tuple[str, JSON] | None = None
            timer: tuple[float, int, str, int] | None = None
            with self.cond:
                if self.events:
                    event = self.events.pop(0)
                elif self.timers and self.timers[0][0] <= time.monotonic():
                    timer = heapq.heappop(self.timers)
                else:
                    wait = self.timers[0][0] - time.monotonic() if self.timers else 1.0
                    self.cond.wait(timeout=max(min(wait, 1.0), 0.0))
                    continue
            try:
                if event is not None:
                    self._on_event(*event)
                elif timer is not None and timer[3] == _STOP:
                    self._stop(timer[2])
                elif timer is not None and timer[3] == _REMOVE:
                    self._remove(timer[2])
                elif timer is not None:
                    self._on_timer(timer[2], timer[3])
            except Exception:
                self.k.log.exception("fake kubelet shard %d failed", self.index)

    def _schedule(self, uid: str, tracked: _Tracked, delay: float) -> None:
        tracked.token += 1
        self._push(uid, tracked.token, delay)

    def _push(self, uid: str, token: int, delay: float) -> None:
        with self.cond:
            heapq.heappush(self.timers, (time.monotonic() + delay, next(self.k.seq), uid, token))
            self.cond.notify()

    def _on_event(self, kind: str, pod: JSON) -> None:
        if kind == "RESYNC":
            present = set(pod["uids"])
            for uid in [u for u in self.pods if u not in present]:
                self._forget(uid)
            return
        if kind == _FAULT:
            self._hit_running(pod["node"], pod["mode"])
            return
        meta = pod.get("metadata", {})
        uid = meta.get("uid", "")
        if kind == "DELETED":
            self._forget(uid)
            return
        node = pod.get("spec", {}).get("nodeName", "")
        if node not in self.k.nodes:
            return
        tracked = self.pods.get(uid)
        if tracked is not None:
            if _not_older(pod, tracked.pod):
                tracked.pod = pod
            if meta.get("deletionTimestamp"):
                self._deleted(uid, tracked)
            return
        tracked = _Tracked(pod=pod, bound_rv=str(meta.get("resourceVersion", "")))
        self.pods[uid] = tracked
        status = pod.get("status", {})
        if meta.get("deletionTimestamp"):
            self._deleted(uid, tracked)
        elif status.get("phase") in TERMINAL_PHASES:
            tracked.done = True
        elif status.get("startTime"):
            self._adopt(uid, tracked)
        else:
            self._schedule(uid, tracked, 0.0)

    # -- a deleted pod: stop it, write it terminal, remove it ----------------------------------
    def _deleted(self, uid: str, tracked: _Tracked) -> None:
        """The pod has a deletionTimestamp: its life's steps end; it stops, then goes."""
        tracked.done = True
        tracked.token += 1  # no step of its life runs any more
        if tracked.pod.get("status", {}).get("phase") in TERMINAL_PHASES:
            # Terminal already (failed, evicted, completed, or stopped by this kubelet): only
            # the final delete is left, unless it has been made (its grace period is then 0).
            if tracked.pod["metadata"].get("deletionGracePeriodSeconds") != 0:
                self._remove_later(uid, tracked, 0.0)
            return
        if not tracked.stopping:
            tracked.stopping = True
            self._push(uid, _STOP, self.k.timing.stop_after)

    def _stop(self, uid: str) -> None:
        """The containers have exited: write the pod terminal, then remove it."""
        tracked = self.pods.get(uid)
        if tracked is None:
            return
        pod = tracked.pod
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            if tracked.run is None and not pod.get("status", {}).get("startTime"):
                # Deleted before this kubelet started it: it had begun (sandbox, pod IP, fate).
                self._admit(uid, tracked)
                tracked.token += 1  # the step _admit scheduled never runs
            status = terminated_status(tracked.pod, time.time())
            if status is not None:
                tracked.pod = self.k.rest.patch(
                    f"/api/v1/namespaces/{ns}/pods/{name}/status",
                    {"metadata": {"uid": uid}, "status": status},
                    STRATEGIC_MERGE_PATCH,
                )
                self.k.log.info("pod %s/%s stopped: %s", ns, name, status["phase"])
        except ApiError as e:
            if e.status in (404, 409):
                return  # gone, or a new pod of the same name (uid precondition)
            if e.status != 422:
                self.k.log.warning("pod %s/%s: stopping: %s; retrying", ns, name, e)
                self._push(uid, _STOP, _RETRY_DELAY)
                return
            # Rejected: removing it anyway beats leaving it Terminating for ever.
            self.k.log.warning("pod %s/%s: terminal status rejected: %s", ns, name, e)
        self._remove_later(uid, tracked, 0.0)

    def _remove_later(self, uid: str, tracked: _Tracked, delay: float) -> None:
        if tracked.removal:
            return
        tracked.removal = "pending"
        self._push(uid, _REMOVE, delay)

    def _remove(self, uid: str) -> None:
        """Delete a terminal pod for good (the status manager's delete once ``canBeDeleted``):
        grace period 0, that incarnation only: the uid precondition keeps a StatefulSet's new
        pod of the same name safe (deleting by name would not). With finalizers left the API
        server keeps the pod until they go, then removes it itself."""
        tracked = self.pods.get(uid)
        if tracked is None or tracked.removal != "pending":
            return
        meta = tracked.pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        try:
            self.k.rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
        except ApiError as e:
            if e.status not in (404, 409):
                self.k.log.warning(
                    "pod %s/%s: final delete failed: %s; retrying", namespace, name, e
                )
                self._push(uid, _REMOVE, _RETRY_DELAY)
                return
        tracked.removal = "sent"

    def _forget(self, uid: str) -> None:
        tracked = self.pods.pop(uid, None)
        if tracked is not None:
            tracked.done = True
            if tracked.pod_ip:
                node = tracked.pod.get("spec", {}).get("nodeName", "")
                self.k.ipam.release(node, tracked.pod_ip)

    def _hit_running(self, node: str, mode: str) -> None:
        """``node``'s runtime broke under its pods: every container running there exits now, as
        a real node's would (state.terminated, restartCount unchanged, the pod no longer
        Ready), and from then on crash-loops like a pod started there after the fault."""
        now = time.time()
        for uid, tracked in self.pods.items():
            run = tracked.run
            if (
                run is None
                or run.node != node
                or run.step != "running"
                or tracked.stopping
                or run.mode != HEALTHY
            ):
                continue
            hit = replace(run, conditions=dict(run.conditions), mode=mode, run_finished=now)
            restarts = restarts_after_exit(tracked.pod, crash_exit_code(hit))
            hit.step = "crashed" if restarts else "failed"
            try:
                self._write(tracked, hit)
            except ApiError as e:
                self.k.log.info("pod %s: not hit by the fault of %s: %s", uid, node, e)
                continue
            self.k.log.info(
                "pod %s/%s on %s: %s (was running)", run.namespace, run.name, node, mode
            )
            if hit.step == "crashed":
                tracked.done = False
                self._schedule(uid, tracked, self.k.timing.first_restart)
            else:
                tracked.done = True

    def _adopt(self, uid: str, tracked: _Tracked) -> None:
        """A pod some earlier kubelet ran: keep a crash loop going, leave the rest alone."""
        pod = tracked.pod
        mode = pod["metadata"].get("annotations", {}).get(FAULT_ANNOTATION, HEALTHY)
        status = pod.get("status", {})
        if mode not in ("crashloop", "oom") or status.get("phase") != "Running":
            tracked.done = True
            return
        restarts = max(
            (int(c.get("restartCount", 0)) for c in status.get("containerStatuses", [])),
            default=0,
        )
        run = self.k.new_run(pod, mode, status.get("hostIP", ""), status.get("podIP", ""))
        run.step = "backoff"
        run.restarts = max(restarts, 1)
        # Its containers here crash the moment they start: every restart was one in a row.
        run.back_off = back_off_after(run.restarts, self.k.timing.back_off_policy)
        run.run_started = run.run_finished = time.time()
        for c in status.get("conditions", []):
            run.conditions[c["type"]] = (c["status"], c.get("lastTransitionTime", ""))
        tracked.run = run
        self._schedule(uid, tracked, self._next_restart(run))

    def _next_restart(self, run: PodRun) -> float:
        """Seconds from the exit ``run`` just recorded to the container's next start."""
        t = self.k.timing
        if t.backoff == "compressed":
            return t.restart_interval
        exit_ = on_exit(run.back_off, run.run_finished - run.run_started, t.back_off_policy)
        if exit_.wait <= 0:
            # Restarted at the next sync. (Unreachable while simulated crashes run 0 s: only a
            # run of over 10 minutes resets the back-off.)
            return t.first_restart
        return restart_delay(exit_.wait, self.rng.random, t.back_off_policy)

    def _on_timer(self, uid: str, token: int) -> None:
        tracked = self.pods.get(uid)
        if tracked is None or tracked.done or token != tracked.token:
            return
        try:
            if tracked.run is None:
                self._admit(uid, tracked)
            else:
                self._advance(uid, tracked)
        except ApiError as e:
            if e.status in (404, 409):
                # Gone, or replaced by a pod of the same name (uid precondition failed).
                tracked.done = True
                return
            if e.status == 422:
                self.k.log.warning("pod %s: status rejected: %s", uid, e)
                tracked.done = True
                return
            # Transient: the step was not taken (see _advance), so it is simply retried.
            self.k.log.warning("pod %s: %s; retrying", uid, e)
            self._schedule(uid, tracked, _RETRY_DELAY)

    def _admit(self, uid: str, tracked: _Tracked) -> None:
        pod = tracked.pod
        meta = pod["metadata"]
        node_name = pod["spec"]["nodeName"]
        node = self._node_at(node_name, tracked.bound_rv)
        # The pod's own fault (an application broken everywhere) wins over its node's.
        mode = (meta.get("labels") or {}).get(SIM_FAULT_LABEL) or (
            node.get("metadata", {}).get("labels", {}).get(SIM_FAULT_LABEL, HEALTHY)
        )
        if mode not in FAULT_MODES and mode != HEALTHY:
            self.k.log.warning(
                "node %s: unknown fault mode %r, treated as healthy", node_name, mode
            )
            mode = HEALTHY
        # Pod-level fates that win over any fault: a pod left terminal long ago, and a pod
        # whose sandbox its own network attachment keeps from being created.
        terminal = terminal_kind(pod)
        if terminal is not None:
            mode = TERMINAL_FATE
        elif multus_networks(pod):
            mode = SANDBOX_FATE
        host_ip = next(
            (
                a["address"]
                for a in node.get("status", {}).get("addresses", [])
                if a.get("type") == "InternalIP"
            ),
            "10.0.0.1",
        )
        ns, name = meta["namespace"], meta["name"]
        tracked.pod = self.k.rest.patch(
            f"/api/v1/namespaces/{ns}/pods/{name}",
            {"metadata": {"uid": uid, "annotations": {FAULT_ANNOTATION: mode}}},
        )
        if pod["spec"].get("hostNetwork"):
            tracked.pod_ip = host_ip
        elif not tracked.pod_ip and mode != SANDBOX_FATE and terminal != "OutOfcpu":
            # (No sandbox, no address: a pod rejected at admission, or whose network fails.)
            cidr = node.get("spec", {}).get("podCIDR") or self.k.fallback_cidr(node_name)
            tracked.pod_ip = self.k.ipam.allocate(node_name, cidr)
        run = self.k.new_run(tracked.pod, mode, host_ip, tracked.pod_ip)
        for c in tracked.pod.get("status", {}).get("conditions", []) or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "True":
                run.conditions["PodScheduled"] = ("True", c.get("lastTransitionTime", ""))
        if terminal is not None:
            self._write_terminal(tracked, run, terminal)
            return
        if mode == SANDBOX_FATE:
            run.step = "sandbox_error"
            self._write(tracked, run)
            self.k.log.info("pod %s/%s on %s: its sandbox fails (Multus)", ns, name, node_name)
            self._sandbox_failed(uid, tracked, run)
            return
        self._write(tracked, run)
        self.k.log.info("pod %s/%s on %s: %s", ns, name, node_name, mode)
        self._schedule(uid, tracked, self.k.timing.start)

    def _write_terminal(self, tracked: _Tracked, run: PodRun, kind: str) -> None:
        """Writes the pod terminal at once, as the kubelet left it ``terminal-age`` ago (a pod
        evicted, stopped by a node shutdown or rejected at admission long before): its last
        status, never run here."""
        pod = tracked.pod
        ended = time.time() - terminal_age(pod)
        status = left_terminal(pod, run, kind, ended)
        tracked.pod = self.k.rest.patch(
            f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
            {"metadata": {"uid": run.uid}, "status": status},
            STRATEGIC_MERGE_PATCH,
        )
        tracked.run = run
        tracked.done = True
        self.k.log.info("pod %s/%s on %s: left %s", run.namespace, run.name, run.node, kind)

    def _sandbox_failed(self, uid: str, tracked: _Tracked, run: PodRun) -> None:
        """One more failed attempt at the pod's sandbox: the kubelet's Warning Event (its count
        raised, as the event recorder does for a repeat), then another attempt later."""
        run.sandbox_attempts += 1
        self._record(
            tracked.pod,
            "Warning",
            "FailedCreatePodSandBox",
            multus_sandbox_message(tracked.pod, run.sandbox_attempts),
            None,
            count=run.sandbox_attempts,
        )
        tracked.run = run
        self._schedule(uid, tracked, self.k.timing.sandbox_retry)

    def _node_at(self, name: str, rv: str) -> JSON:
        """The node as it was at revision ``rv`` (for what the pod reads of it: its fault label;
        its addresses and pod CIDR do not change); its current state if that is not available.

        The Node as it is now (one GET), unchanged since ``rv``, or with the fault label the
        node watch says it had at ``rv``; only when neither can say, the API server's answer
        for that exact revision (an etcd read of every Node)."""
        try:
            node: JSON | None = self.k.rest.get(f"/api/v1/nodes/{name}")
        except ApiError as e:
            if e.status != 404:
                raise
            node = None  # deleted since: what it was at the binding is still on record
        if node is not None:
            try:
                bound, newest = int(rv), int(str(node["metadata"].get("resourceVersion", "")))
            except (TypeError, ValueError):
                return node
            if newest <= bound:
                return node
            known, fault = self.k.node_faults.fault_at(name, bound, newest, timeout=2.0)
            if known:
                labels = dict(node["metadata"].get("labels") or {})
                labels.pop(SIM_FAULT_LABEL, None)
                if fault is not None:
                    labels[SIM_FAULT_LABEL] = fault
                return {**node, "metadata": {**node["metadata"], "labels": labels}}
        if rv:
            try:
                page = self.k.rest.get(
                    "/api/v1/nodes",
                    {
                        "fieldSelector": f"metadata.name={name}",
                        "resourceVersion": rv,
                        "resourceVersionMatch": "Exact",
                    },
                )
                items: list[JSON] = page.get("items", [])
                if items:
                    return items[0]
            except ApiError as e:
                if e.status not in (400, 410):  # 410: compacted away; fall back below
                    raise
                self.k.log.info("node %s at revision %s: %s; as it is now", name, rv, e)
        # As read above; a node deleted since and gone from history too: 404, the pod's end.
        return node if node is not None else self.k.rest.get(f"/api/v1/nodes/{name}")

    def _advance(self, uid: str, tracked: _Tracked) -> None:
        assert tracked.run is not None
        # Work on a copy: the step counts as taken only once its status is written.
        run = replace(tracked.run, conditions=dict(tracked.run.conditions))
        t = self.k.timing
        now = time.time()
        nxt: Step | None = None
        delay = 0.0
        pod = tracked.pod
        mode, step = run.mode, run.step
        crashing = mode in _CRASHING_MODES
        if step == "sandbox_error":
            self._sandbox_failed(uid, tracked, run)
            return
        if step == "creating":
            run.run_started = now
            if mode == "pullhang":
                self._record_pulls(pod, hung=True)
                tracked.done = True
                return
            took = t.start
            if mode != "imagepull" and pull_takes(pod) > 0:
                if run.pull_started <= 0 and self._pulls_first(pod):
                    # The node has not got the image: the sandbox is up, the kubelet pulls
                    # (one Pulling Event), the containers wait in ContainerCreating.
                    run.pull_started = now
                    self._record_pulls(pod, hung=True)
                    tracked.run = run
                    self._schedule(uid, tracked, pull_takes(pod))
                    return
                if run.pull_started > 0:
                    took = now - run.pull_started
            if mode != "imagepull":
                self._record_pulls(pod, hung=False, took=took)
            if mode in (HEALTHY, "evict") or (crashing and run.runs_for > 0):
                nxt = "running"
            elif crashing:
                run.run_finished = now
                nxt = "crashed" if restarts_after_exit(pod, crash_exit_code(run)) else "failed"
            elif mode == "imagepull":
                nxt = "pull_error"
            else:
                nxt = "create_error"
        elif step == "running":
            if crashing and run.runs_for > 0:
                # An application that runs a while, then exits: restarted at once after its
                # first exit, in back-off after the later ones (or not at all, by its policy).
                run.run_finished = now
                if not restarts_after_exit(pod, crash_exit_code(run)):
                    nxt = "failed"
                else:
                    nxt = "crashed" if run.back_off <= 0 else "backoff"
            elif mode == "evict":
                run.run_finished = now
                nxt = "evicted"
            elif is_job_pod(pod):
                run.run_finished = now
                nxt = "completed"
        elif step in ("crashed", "backoff"):
            # The kubelet restarts the container (at once after its first exit, after the
            # back-off later), setting its back-off entry; on this node it exits at once again,
            # or runs its while first.
            run.back_off = on_exit(
                run.back_off, run.run_finished - run.run_started, t.back_off_policy
            ).after
            run.restarts += 1
            if run.runs_for > 0:
                run.prev_started, run.prev_finished = run.run_started, run.run_finished
                run.run_started = now
                nxt = "running"
            else:
                run.run_started = run.run_finished = now
                nxt = "backoff"
        elif step == "pull_error":
            nxt = "pull_backoff"
        if nxt is None:
            tracked.done = True
            return
        run.step = nxt
        self._write(tracked, run)
        if nxt == "evicted":
            self._record_eviction(tracked.pod)
        if nxt == "running":
            if crashing and run.runs_for > 0:
                delay = run.runs_for
            elif mode == "evict":
                delay = t.evict_after
            elif is_job_pod(pod):
                delay = t.job_runtime
            else:
                tracked.done = True
                return
        elif nxt == "crashed":
            delay = t.first_restart
        elif nxt == "backoff":
            delay = self._next_restart(run)
        elif nxt == "pull_error":
            delay = t.pull_backoff
        else:
            tracked.done = True
            return
        self._schedule(uid, tracked, delay)

    def _pulls_first(self, pod: JSON) -> bool:
        """Whether the pod's node lacks one of its images: its start pulls it first."""
        spec = pod.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        return any(
            not self.k.has_image(node, str(c.get("image") or ""))
            for key in ("initContainers", "containers")
            for c in spec.get(key) or []
        )

    def _write(self, tracked: _Tracked, run: PodRun) -> None:
        """Patches the status of ``run``'s step; ``run`` becomes the pod's state if that works."""
        body = {
            "metadata": {"uid": run.uid},
            "status": pod_status(tracked.pod, run, time.time()),
        }
        tracked.pod = self.k.rest.patch(
            f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
            body,
            STRATEGIC_MERGE_PATCH,
        )
        tracked.run = run

    def _record_pulls(self, pod: JSON, *, hung: bool, took: float | None = None) -> None:
        """The kubelet's Events for the pod's image pulls, as v1.36 writes them (recorded:
        tests/fixtures/real-kubelet/crashloop.json, image-pull-hangs.json): ``Pulling`` for a
        pull that hangs (or has not ended yet: a slow pull); ``Pulled`` "Successfully pulled
        ... Image size" for the first pull of an image on its node, which takes ``took``
        seconds (``Timing.start`` by default). A later start on that node finds the image
        there; the kubelet then writes "already present on machine", which nothing reads, so
        it is not written here (one write less per pod start)."""
        spec = pod.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        took_text = go_duration_ms(self.k.timing.start if took is None else took)
        for key, path in (("initContainers", "initContainers"), ("containers", "containers")):
            for container in spec.get(key) or []:
                image = str(container.get("image") or "")
                field_path = f"spec.{path}{{{container.get('name', '')}}}"
                if hung:
                    self._record(pod, "Normal", "Pulling", f'Pulling image "{image}"', field_path)
                    return  # the kubelet pulls one container's image at a time
                if self.k.first_pull(node, image):
                    message = (
                        f'Successfully pulled image "{image}" in {took_text} ({took_text} '
                        f"including waiting). Image size: {_FAKE_IMAGE_SIZE} bytes."
                    )
                    self._record(pod, "Normal", "Pulled", message, field_path)

    def _record(
        self,
        pod: JSON,
        kind: str,
        reason: str,
        message: str,
        field_path: str | None,
        *,
        count: int = 1,
    ) -> None:
        """One Event about ``pod`` through the kubelet's legacy recorder: the pod and its uid,
        the container as fieldPath (none for the pod itself), the node as ``source.host``.
        ``count`` above 1: the same Event again, as the recorder's correlator writes a repeat
        (the count raised, ``lastTimestamp`` and the message renewed). Best effort, as the
        kubelet's own Events are."""
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        key = f"{meta.get('uid')}/{field_path}/{reason}"
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{zlib.crc32(key.encode()):08x}"},
            "involvedObject": {
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": meta.get("uid"),
                "apiVersion": "v1",
                "resourceVersion": meta.get("resourceVersion"),
                **({"fieldPath": field_path} if field_path else {}),
            },
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": node},
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
            "type": kind,
            "reportingComponent": "kubelet",
            "reportingInstance": node,
        }
        try:
            if count > 1:
                try:
                    self.k.rest.patch(
                        f"/api/v1/namespaces/{namespace}/events/{body['metadata']['name']}",
                        {"count": count, "lastTimestamp": at, "message": message},
                    )
                    return
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    body["count"] = count
            self.k.rest.post(f"/api/v1/namespaces/{namespace}/events", body)
        except ApiError as exc:
            self.k.log.warning("could not record %s for %s/%s: %s", reason, namespace, name, exc)

    def _record_eviction(self, pod: JSON) -> None:
        """The Warning Event the eviction manager records on the pod it evicts, as kubelet
        v1.36 writes it (tests/fixtures/real-kubelet/evicted-disk-pressure.json): reason
        Evicted, about the pod, not one of its containers."""
        self._record(pod, "Warning", "Evicted", eviction_message(pod), None)


class _NodeFaults:
    """The fault label of every Node over time, from a LIST and WATCH of the Nodes: a pod's
    fault is its node's at the pod's binding, which this answers from memory.

    The API server can say what a Node was at a revision only with an exact-revision LIST,
    which reads every Node from etcd at that revision: at 240 nodes that cost more than all the
    rest of a pod's start (the scale bench's rollout fell from 18 to 2 pods a second). Here a
    node's history holds an entry per change of its label, from the first revision this watch
    knows it at; a revision before that is not answered (the caller asks the API server)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        # node -> [(resourceVersion, fault label or None)], one entry per change, oldest first.
        self.history: dict[str, list[tuple[int, str | None]]] = {}
        # node -> the newest revision of it this watch has applied.
        self.seen: dict[str, int] = {}

    def restart(self) -> None:
        """A new LIST: what happened between the last event and it is unknown."""
        with self.cond:
            self.history.clear()
            self.seen.clear()

    def record(self, node: JSON) -> bool:
        """Applies one revision of ``node``; True when its fault label changed with it."""
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        try:
            rv = int(str(meta.get("resourceVersion", "")))
        except ValueError:
            return False
        fault = (meta.get("labels") or {}).get(SIM_FAULT_LABEL)
        changed = False
        with self.cond:
            changes = self.history.setdefault(name, [])
            if not changes or changes[-1][1] != fault:
                changes.append((rv, fault))
                changed = True
            self.seen[name] = max(self.seen.get(name, 0), rv)
            self.cond.notify_all()
        return changed

    def fault_at(self, name: str, rv: int, newest: int, timeout: float) -> tuple[bool, str | None]:
        """(known, the fault label) of ``name`` at revision ``rv``, once this watch has applied
        the node's revision ``newest`` (read from the API server just now); not known when the
        watch does not get there within ``timeout`` or started after ``rv``."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.seen.get(name, 0) >= newest, timeout):
                return False, None
            changes = self.history.get(name) or []
            if not changes or changes[0][0] > rv:
                return False, None
            fault: str | None = None
            for since, value in changes:
                if since > rv:
                    break
                fault = value
            return True, fault


@dataclass
class FakeKubelet:
    """Runs the pods of ``nodes`` (see the module docstring). ``start()``, then ``stop()``."""

    rest: Rest
    nodes: frozenset[str]
    timing: Timing = field(default_factory=Timing)
    shards: int = 2
    fallback_cidr: Callable[[str], str] = lambda node: addresses.node_pod_cidr(0)
    # Where decisions and problems go (one logger per cluster, so each has its own log file).
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("localcluster.kubelet"))

    def __post_init__(self) -> None:
        self.stopped = threading.Event()
        self.synced = threading.Event()
        self.seq = itertools.count()
        self.ipam = _IPAM()
        # (node, image) pulled on that node: every shard's pods share the node's images.
        self._images: set[tuple[str, str]] = set()
        self._images_lock = threading.Lock()
        self._shards = [_Shard(self, i) for i in range(max(self.shards, 1))]
        self._watcher = threading.Thread(target=self._watch_loop, name="fake-kubelet-watch")
        self._watcher.daemon = True
        self.node_faults = _NodeFaults()
        self._node_watcher = threading.Thread(
            target=self._watch_nodes, name="fake-kubelet-nodes", daemon=True
        )

    def has_image(self, node: str, image: str) -> bool:
        """Whether ``node`` has ``image`` (a pod started it there)."""
        with self._images_lock:
            return (node, image) in self._images

    def first_pull(self, node: str, image: str) -> bool:
        """Whether ``node`` pulls ``image`` now: its first start of it; later ones find it."""
        with self._images_lock:
            if (node, image) in self._images:
                return False
            self._images.add((node, image))
            return True

    def new_run(self, pod: JSON, mode: str, host_ip: str, pod_ip: str) -> PodRun:
        meta = pod["metadata"]
        return PodRun(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=pod["spec"]["nodeName"],
            mode=mode,
            host_ip=host_ip,
            pod_ip=pod_ip,
            start_time=time.time(),
            runs_for=runs_for(pod),
            exit_code=exit_code_of(pod),
        )

    def start(self) -> None:
        for s in self._shards:
            s.thread.start()
        self._node_watcher.start()
        self._watcher.start()

    def stop(self) -> None:
        self.stopped.set()
        for s in self._shards:
            with s.cond:
                s.cond.notify_all()
        for s in self._shards:
            s.thread.join(timeout=5)
        self._watcher.join(timeout=1)
        self._node_watcher.join(timeout=1)

    def _shard(self, uid: str) -> _Shard:
        return self._shards[zlib.crc32(uid.encode()) % len(self._shards)]

    def _dispatch(self, kind: str, pod: JSON) -> None:
        self._shard(pod.get("metadata", {}).get("uid", "")).put(kind, pod)

    def _list(self) -> str:
        """Lists bound pods, hands each to its shard, drops vanished ones; returns the RV."""
        params = {"fieldSelector": "spec.nodeName!=", "limit": "500"}
        uids: list[str] = []
        while True:
            page = self.rest.get("/api/v1/pods", params)
            for pod in page.get("items", []):
                uids.append(pod["metadata"]["uid"])
                self._dispatch("ADDED", pod)
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                rv = str(page.get("metadata", {}).get("resourceVersion", ""))
                break
            params = {**params, "continue": cont}
        for s in self._shards:
            s.put("RESYNC", {"uids": uids})
        return rv

    def _list_nodes(self) -> str:
        """Lists every Node into ``node_faults`` (afresh); returns the list's revision."""
        self.node_faults.restart()
        params: dict[str, str] = {"limit": "500"}
        while True:
            page = self.rest.get("/api/v1/nodes", params)
            for node in page.get("items", []):
                self.node_faults.record(node)
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                return str(page.get("metadata", {}).get("resourceVersion", ""))
            params = {**params, "continue": cont}

    def _watch_nodes(self) -> None:
        self._list_watch("/api/v1/nodes", {}, self._list_nodes, self._on_node)

    def _on_node(self, kind: str, node: JSON) -> None:
        """Records the node's fault; a fault that hits running containers goes to every shard
        (each holds some of the node's pods)."""
        if not self.node_faults.record(node) or kind == "DELETED":
            return
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        mode = labels.get(SIM_FAULT_LABEL)
        if mode in _CRASHING_MODES and labels.get(SIM_FAULT_HITS_RUNNING_LABEL) == "true":
            for shard in self._shards:
                shard.put(_FAULT, {"node": meta.get("name", ""), "mode": mode})

    def _listed_pods(self) -> str:
        rv = self._list()
        self.synced.set()
        return rv

    def _watch_loop(self) -> None:
        self._list_watch(
            "/api/v1/pods", {"fieldSelector": "spec.nodeName!="}, self._listed_pods, self._dispatch
        )

    def _list_watch(
        self,
        path: str,
        params: dict[str, str],
        listed: Callable[[], str],
        apply: Callable[[str, JSON], None],
    ) -> None:
        """LIST (``listed`` returns the revision), then WATCH ``path`` from there, handing each
        change to ``apply``; a new watch from the last revision seen when one ends, a new LIST
        when the revision is too old, until the kubelet stops."""
        rv = ""
        while not self.stopped.is_set():
            try:
                if not rv:
                    rv = listed()
                watched = {**params, "resourceVersion": rv}
                for event in self.rest.watch(path, watched, timeout_seconds=5):
                    if self.stopped.is_set():
                        return
                    etype, obj = event.get("type"), event.get("object", {})
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            rv = ""  # too old: relist
                        break
                    rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        apply(str(etype), obj)
            except ApiError as e:
                if self.stopped.is_set():
                    return
                if e.status == 410:
                    rv = ""
                self.log.debug("watch of %s: %s", path, e)
                time.sleep(0.5)
            except Exception:
                if self.stopped.is_set():
                    return
                self.log.exception("watch of %s failed", path)
                time.sleep(0.5)
