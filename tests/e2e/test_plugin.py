"""``kubectl kn-rescheduler`` on the real control plane: after a real move, what it says is what
the API shows, and it writes nothing unless asked.

A Deployment crash-loops on a faulty kwok node and is moved once by detect-failures and
update-annotations (in-process, the webhook stamping its pods); the plugin then reads it back.
Two tests install the plugin, as pip does and as Krew does from a release's manifest and archive,
and run it through the cluster's own kubectl, which finds it on the PATH by its name.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform as host
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dev.localcluster.bins import ensure_krew
from dev.tools import krew
from dev.tools.tgz import deterministic_tgz
from kubectl_kn_rescheduler import cli
from shared.api import movedoff
from shared.api.keys import (
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    POLICY_ANNOTATION,
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_TAINT_EFFECT,
)
from shared.api.nodehealth import NodeHealth, Seen
from shared.api.pressure import Record as PressureRecord
from shared.platform.kube import Kube
from tests.e2e.conftest import Loop, pod_template, wait_for
from tests.e2e.test_rescheduling import failing_pod, move_once, only

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# The version of the plugin archives a test makes.
VERSION = "0.0.1"


@pytest.fixture
def plugin(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    """Run the plugin's command line against the cluster; (exit status, what it printed)."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))

    def run(*argv: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(list(argv), out, err)
        return code, out.getvalue() + err.getvalue()

    return run


def as_json(result: tuple[int, str]) -> Any:
    code, printed = result
    assert code == 0, printed
    return json.loads(printed)


def deployment(api: Kube, namespace: str, name: str, node: str, **annotations: str) -> None:
    api.create(
        "Deployment",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": pod_template({"app": name}, node),
            },
        },
    )


@pytest.fixture
def moved(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> Iterator[str]:
    """A Deployment ``web`` moved once off the faulty node it prefers; that node."""
    bad = cluster.nodes[0]
    faults("crashloop", bad)
    deployment(api, namespace, "web", bad, **{POLICY_ANNOTATION: "3"})
    move_once(api, loop, namespace, bad)
    yield bad


def test_status_says_the_move_the_api_shows(
    plugin: Callable[..., tuple[int, str]], api: Kube, namespace: str, moved: str
) -> None:
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    said = as_json(plugin("-n", namespace, "-o", "json", "status", "deployment/web"))
    (holder,) = said["holders"]
    assert (holder["kind"], holder["name"], holder["budget"]) == ("ReplicaSet", rs, 3)
    assert holder["state"]["moves"] == 1
    assert holder["state"]["excludedNodes"] == [moved]
    assert holder["state"]["failedOn"] == {moved: "CrashLoopBackOff"}
    assert [e["reason"] for e in said["events"]] == ["Rescheduled"]
    assert said["events"][0]["object"] == f"ReplicaSet/{rs}"

    code, text = plugin("status", "deploy/web", "-n", namespace)
    assert code == 0
    assert "moves: 1 of 3 used" in text
    assert f"{moved}: failed there with CrashLoopBackOff" in text


def test_explain_runs_update_annotations_in_a_dry_run_and_nothing_is_stored(
    plugin: Callable[..., tuple[int, str]],
    cluster: Any,
    api: Kube,
    namespace: str,
    loop: Loop,
    faults: Callable[..., None],
) -> None:
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    deployment(api, namespace, "api", bad, **{POLICY_ANNOTATION: "2"})
    pod = wait_for("a pod failing on the faulty node", lambda: failing_pod(api, loop, namespace))
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]

    said = as_json(plugin("-n", namespace, "-o", "json", "explain", name))
    detected = said["verdicts"][0]
    assert (detected["function"], detected["reason"]) == ("detect-failures", "CrashLoopBackOff")
    assert detected["rule"].startswith("docs/failure-rules.md#")
    acted = said["updateAnnotations"]
    assert acted["error"] is None
    assert acted["reply"].startswith("io.kn-rescheduler.pod.rescheduled")
    sent = "\n".join(acted["calls"])
    assert "PATCH /apis/apps/v1/namespaces" in sent and f"pods/{name} -> 200 (dry run)" in sent
    assert all(call.endswith("(dry run)") for call in acted["calls"]), acted["calls"]

    # The API server validated every write and stored none.
    rs = only(api, "ReplicaSet", namespace)
    assert STATE_ANNOTATION not in (rs["metadata"].get("annotations") or {})
    assert api.get("Pod", namespace, name)["metadata"]["uid"] == uid


def test_explain_says_why_a_pod_nobody_opted_in_is_left_alone(
    plugin: Callable[..., tuple[int, str]],
    cluster: Any,
    api: Kube,
    namespace: str,
    faults: Callable[..., None],
) -> None:
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    deployment(api, namespace, "plain", bad)

    def crash_looping() -> dict[str, Any] | None:
        for pod in api.list_all("Pod", namespace):
            for status in pod.get("status", {}).get("containerStatuses") or []:
                if status.get("restartCount", 0) >= 3:
                    return pod
        return None

    pod = wait_for("the pod crash-looping on the faulty node", crash_looping)
    code, text = plugin("-n", namespace, "explain", f"pod/{pod['metadata']['name']}")
    assert code == 0
    assert "detect-failures: reports nothing: not opted in" in text
    assert "update-annotations: nothing reaches it" in text


def test_nodes_says_each_mark_of_ours_and_cleanup_removes_them_only_when_asked(
    plugin: Callable[..., tuple[int, str]], cluster: Any, api: Kube, moved: str, namespace: str
) -> None:
    node = cluster.nodes[2]
    now = datetime.now(UTC)
    record = NodeHealth(
        failures=(
            Seen(now, f"Deployment {namespace}/web", "uid-1", "CrashLoopBackOff"),
            Seen(now, f"Deployment {namespace}/api", "uid-2", "OOMKilled"),
        ),
        suspect_since=now,
        suspect_workloads=(f"Deployment {namespace}/api", f"Deployment {namespace}/web"),
    )
    taints = api.get("Node", None, node)["spec"].get("taints") or []
    api.merge_patch(
        "Node",
        None,
        node,
        {
            "metadata": {
                "labels": {SUSPECT_LABEL: "true", MOVED_OFF_LABEL: movedoff.mark_value(now)},
                "annotations": {NODE_HEALTH_ANNOTATION: record.to_json()},
            },
            "spec": {
                "taints": [
                    *taints,
                    {"key": SUSPECT_LABEL, "value": "true", "effect": SUSPECT_TAINT_EFFECT},
                ]
            },
        },
    )

    listed = {n["name"]: n for n in as_json(plugin("-o", "json", "nodes"))}
    # The move may have marked the node it left (a mark needs more than this one workload).
    assert node in listed and set(listed) <= {node, moved}
    assert set(listed[node]["marks"]) == {
        SUSPECT_LABEL,
        f"taint {SUSPECT_LABEL}",
        NODE_HEALTH_ANNOTATION,
        MOVED_OFF_LABEL,
    }
    said = "\n".join(listed[node]["said"])
    assert "suspect (label and taint) since" in said
    assert "assess-nodes' next review keeps it suspect" in said
    assert "moved-off: a pod was moved off it" in said

    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    versions = {
        "node": api.get("Node", None, node)["metadata"]["resourceVersion"],
        "rs": api.get("ReplicaSet", namespace, rs)["metadata"]["resourceVersion"],
    }
    code, text = plugin("cleanup")
    assert code == 0 and f"Node {node}: would remove" in text
    assert f"ReplicaSet {namespace}/{rs}: would remove annotation {STATE_ANNOTATION}" in text
    code, text = plugin("cleanup", "--dry-run=server")
    assert code == 0 and f"(server dry run) Node {node}: removed" in text
    assert versions == {
        "node": api.get("Node", None, node)["metadata"]["resourceVersion"],
        "rs": api.get("ReplicaSet", namespace, rs)["metadata"]["resourceVersion"],
    }, "listing and a server dry run wrote something"

    code, text = plugin("cleanup", "--yes")
    assert code == 0 and f"Node {node}: removed" in text
    assert as_json(plugin("-o", "json", "nodes")) == []
    assert STATE_ANNOTATION not in (
        api.get("ReplicaSet", namespace, rs)["metadata"].get("annotations") or {}
    )


def test_after_an_uninstall_the_pressure_label_stays_unless_it_is_named(
    plugin: Callable[..., tuple[int, str]], cluster: Any, api: Kube
) -> None:
    # No settings ConfigMap (as after kubectl delete -k): status=presure beside our record may
    # be the original scheduler's label, since the record does not say which label it was for.
    node = cluster.nodes[3]
    record = PressureRecord(rule="cpu", value=91.5, since=datetime.now(UTC))

    def mark() -> None:
        api.merge_patch(
            "Node",
            None,
            node,
            {
                "metadata": {
                    "labels": {PRESSURE_LABEL_KEY: PRESSURE_LABEL_VALUE},
                    "annotations": {PRESSURE_ANNOTATION: record.to_json()},
                }
            },
        )

    def marks() -> tuple[str | None, bool]:
        meta = api.get("Node", None, node)["metadata"]
        return (meta.get("labels") or {}).get(PRESSURE_LABEL_KEY), PRESSURE_ANNOTATION in (
            meta.get("annotations") or {}
        )

    mark()
    code, text = plugin("cleanup", "--yes")
    assert code == 0 and "the pressure label is left on every node" in text, text
    assert marks() == (PRESSURE_LABEL_VALUE, False), "the label stays, our record goes"

    mark()
    label = f"{PRESSURE_LABEL_KEY}={PRESSURE_LABEL_VALUE}"
    code, text = plugin("cleanup", "--yes", "--pressure-label", label)
    assert code == 0 and f"Node {node}: removed label {label}" in text, text
    assert marks() == (None, False)


def test_kubectl_finds_the_installed_plugin_by_its_name(cluster: Any, tmp_path: Path) -> None:
    # What an sdist carries, built outside the checkout (pip builds in the source tree).
    source = tmp_path / "src"
    source.mkdir()
    for part in ("kubectl_kn_rescheduler", "shared"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source / "pyproject.toml")
    target = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        timeout=180,
    )
    env = {
        **os.environ,
        "PATH": f"{target / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(target),
    }

    # kubectl takes no flag of its own before a plugin's name: the kubeconfig comes from the
    # environment, as the plugin reads it.
    def run_kubectl(*args: str) -> str:
        done = subprocess.run(
            [str(cluster.bins_dir / "kubectl"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "KUBECONFIG": str(cluster.kubeconfig)},
            cwd=tmp_path,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "kubectl-kn_rescheduler" in run_kubectl("plugin", "list")
    said = json.loads(run_kubectl("kn-rescheduler", "nodes", "--all", "-o", "json"))
    assert {n["name"] for n in said} == set(cluster.nodes)


def test_krew_installs_the_release_s_plugin_and_it_runs_on_the_system_s_python(
    cluster: Any, tmp_path: Path
) -> None:
    # The archive a release makes for this machine, and a manifest naming it.
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(host.machine(), host.machine())
    mine = [p for p in krew.PLATFORMS if (p.os, p.arch) == (sys.platform, arch)]
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if not mine or system_python is None:
        pytest.skip(f"no archive for {sys.platform}/{arch} or no python3 in /usr/bin")
    (platform,) = mine
    sites = tmp_path / "sites"
    packed = deterministic_tgz(krew.tree(platform, krew.installed(sites, [platform])[platform]))
    archive = tmp_path / krew.archive_name(VERSION, platform)
    archive.write_bytes(packed)
    digest = hashlib.sha256(packed).hexdigest()
    manifest = tmp_path / "kn-rescheduler.yaml"
    manifest.write_text(
        krew.manifest(
            VERSION, krew.RELEASES, {krew.archive_name(VERSION, p): digest for p in krew.PLATFORMS}
        )
    )
    # Nothing of this checkout's: the system's Python, no virtualenv, no PYTHONPATH.
    root = tmp_path / "krew-root"
    env = {
        "HOME": str(tmp_path),
        "KREW_ROOT": str(root),
        "PATH": f"{root / 'bin'}:/usr/bin:/bin",
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    installed = subprocess.run(
        [str(ensure_krew()), "install", f"--manifest={manifest}", f"--archive={archive}"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert (root / "bin" / krew.EXECUTABLE).is_symlink()

    done = subprocess.run(
        [str(cluster.bins_dir / "kubectl"), "kn-rescheduler", "nodes", "--all", "-o", "json"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert {n["name"] for n in json.loads(done.stdout)} == set(cluster.nodes)

    # The same executable is kn's plugin under the name kn looks for (docs/plugin.md).
    kn_plugin = tmp_path / "kn-plugins" / "kn-rescheduler"
    kn_plugin.parent.mkdir()
    kn_plugin.symlink_to(root / "bin" / krew.EXECUTABLE)
    done = subprocess.run(
        [str(kn_plugin), "nodes", "--all", "-o", "json"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert {n["name"] for n in json.loads(done.stdout)} == set(cluster.nodes)


def test_status_reads_the_policy_as_the_functions_do_and_only_events_about_its_objects(
    plugin: Callable[..., tuple[int, str]], api: Kube, namespace: str
) -> None:
    # The installed settings, in a namespace of this test's: at most 5 retries.
    api.create(
        "ConfigMap",
        namespace,
        {
            "metadata": {
                "name": "kn-rescheduler-config-test",
                "labels": {
                    "app.kubernetes.io/component": "config",
                    "app.kubernetes.io/part-of": "kn-rescheduler",
                },
            },
            "data": {"KN_RESCHEDULER_MAX_RETRIES": "5"},
        },
    )
    deployment(api, namespace, "greedy", "no-such-node", **{POLICY_ANNOTATION: "8"})
    pod = wait_for(
        "the Deployment's pod",
        lambda: next(iter(api.list_all("Pod", namespace, label_selector="app=greedy")), None),
    )
    # An Event claiming to be ours about another object of the same name.
    api.create(
        "Event",
        namespace,
        {
            "metadata": {"name": "forged"},
            "involvedObject": {"kind": "ConfigMap", "name": "greedy", "namespace": namespace},
            "reason": "Rescheduled",
            "message": "moved pod greedy-x off node node-0",
            "type": "Normal",
            "reportingComponent": "kn-rescheduler",
            "source": {"component": "kn-rescheduler"},
        },
    )

    # Asked about the pod, the plugin answers for its Deployment, with the installed maximum.
    said = as_json(
        plugin(
            "-n",
            namespace,
            "--installed-in",
            namespace,
            "-o",
            "json",
            "status",
            f"pod/{pod['metadata']['name']}",
        )
    )
    assert (said["kind"], said["name"]) == ("Deployment", "greedy")
    assert said["note"].startswith(f"pod {pod['metadata']['name']} belongs to ReplicaSet")
    assert said["policy"] == "8" and "more than the maximum of 5" in said["policyRefused"]
    assert said["events"] == []


def test_status_of_a_cronjobs_job_reads_the_cronjobs_policy(
    plugin: Callable[..., tuple[int, str]], api: Kube, namespace: str
) -> None:
    api.create(
        "CronJob",
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "nightly", "annotations": {POLICY_ANNOTATION: "2"}},
            "spec": {
                "schedule": "0 3 * * *",
                "suspend": True,
                "jobTemplate": {
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "job", "image": "registry.example/job:1"}],
                            }
                        }
                    }
                },
            },
        },
    )
    cronjob = api.get("CronJob", namespace, "nightly")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "nightly-manual",
            # As `kubectl create job --from=cronjob/nightly` writes it.
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": "nightly",
                    "uid": cronjob["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": cronjob["spec"]["jobTemplate"]["spec"],
    }
    api.create("Job", namespace, job)
    said = as_json(plugin("-n", namespace, "-o", "json", "status", "job/nightly-manual"))
    assert (said["policy"], said["policyOn"]) == (2, "CronJob nightly")
    assert said["holders"][0]["budget"] == 2
