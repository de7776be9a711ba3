"""Pod events from a kube-apiserver, produced by Knative's own ApiServerSource adapter.

Locally there is no Knative controller to deploy the ApiServerSource's receive adapter, so this
runs the adapter binary itself (``cmd/apiserver_receive_adapter`` of knative.dev/eventing,
pinned in ``hack/adapter/go.mod`` and built by ``hack/build-adapter.sh``) outside any cluster,
configured the way the controller configures its Deployment:

- ``--kubeconfig`` (knative.dev/pkg's client flags) points it at the API server; the event
  ``source`` is that server's URL.
- ``K_SINK`` is where events go (the local broker), ``NAME`` / ``NAMESPACE`` name the
  ApiServerSource, ``K_SOURCE_CONFIG`` is the JSON the controller derives from its spec
  (namespaces or all namespaces, resources as group/version/resource, mode, owner, filters).
- ``K_KLOG_VERBOSITY=2`` makes client-go log "Caches populated" once a watch's initial list is
  done: from then on every change is sent, which is what :meth:`ApiServerSource.start` waits
  for. As in a cluster, objects that exist before that produce no event.
- ``PROFILING_PORT=0``: the pprof server (default :8008) takes a free port instead. The health
  probe server's :8080 is a constant of knative.dev/pkg and cannot be moved; when that port is
  taken the adapter runs on without probes (the error is ignored), so several adapters, or an
  adapter and anything else on 8080, can coexist, whoever binds 8080 first keeps it.

What it watches comes from the ApiServerSource in ``knative/sources.yaml``
(:func:`from_manifest`, :meth:`ApiServerSource.from_manifest`), translated the way Knative's
controller translates it (``pkg/reconciler/apiserversource/resources/receive_adapter.go``): a
resource's ``apiVersion``/``kind`` become the guessed plural resource
(``meta.UnsafeGuessKindToResource``), its ``selector`` the label selector string
(``metav1.LabelSelectorAsSelector(...).String()``), which the adapter hands to its list and
watch so the API server filters what it sends; an empty ``namespaceSelector`` means every
namespace, none the source's own. So the local stack watches exactly the pods a cluster's
source would, label selector included.

The events are Knative's, byte for byte: binary mode, ``dev.knative.apiserver.resource.add``,
``.update`` or ``.delete``, a fresh UUID ``id``, ``subject`` ``/apis/v1/namespaces/NS/pods/NAME``,
the extensions ``kind``, ``apiversion``, ``name``, ``namespace``, the whole object as JSON data.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from shared.api.keys import DEFAULT_NAMESPACE

ROOT: Final = Path(__file__).resolve().parents[2]
# The project's pod event source: the ApiServerSource the local stack reproduces.
MANIFEST: Final = ROOT / "knative" / "sources.yaml"
MANIFEST_SOURCE: Final = "pod-events"
BUILD_SCRIPT: Final = ROOT / "hack" / "build-adapter.sh"
# Overrides the binary (for a prebuilt adapter); otherwise hack/build-adapter.sh finds or builds it.
BINARY_ENV: Final = "KN_RESCHEDULER_ADAPTER"
# client-go's reflector logs this at verbosity 2 when a watch's initial list is in.
_READY_MARK: Final = '"Caches populated"'
_PR_SET_PDEATHSIG: Final = 1


class SourceError(RuntimeError):
    """The adapter could not be built, started, or did not become ready."""


def knative_dir() -> Path:
    """Where Knative Eventing's data plane binaries and their config/ are (built if needed)."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SourceError(f"{BUILD_SCRIPT.name} failed:\n{result.stderr[-4000:]}")
    lines = result.stdout.strip().splitlines()
    if not lines:
        raise SourceError(f"{BUILD_SCRIPT.name} printed no path")
    return Path(lines[-1])


def adapter_binary() -> Path:
    """The receive adapter binary: ``$KN_RESCHEDULER_ADAPTER`` or the cached build."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise SourceError(f"{BINARY_ENV}={override} is not an executable")
        return path
    return knative_dir() / "apiserver_receive_adapter"


def gvr(resource: str) -> dict[str, str]:
    """``v1/pods`` or ``apps/v1/deployments`` as the GroupVersionResource the adapter reads."""
    parts = resource.strip("/").split("/")
    if len(parts) == 2:
        return {"Group": "", "Version": parts[0], "Resource": parts[1]}
    if len(parts) == 3:
        return {"Group": parts[0], "Version": parts[1], "Resource": parts[2]}
    raise ValueError(f"expected VERSION/RESOURCE or GROUP/VERSION/RESOURCE, got {resource!r}")


# apimachinery's unpluralizedSuffixes (pkg/api/meta/restmapper.go).
_UNPLURALIZED: Final = ("endpoints",)
_OPERATORS: Final = {"In": " in ", "NotIn": " notin ", "Exists": "", "DoesNotExist": ""}


def guess_resource(api_version: str, kind: str) -> str:
    """``apiVersion``/``kind`` as ``[GROUP/]VERSION/RESOURCE``, pluralised as Knative's controller
    does it (apimachinery's ``UnsafeGuessKindToResource``, no discovery): ``Pod`` -> ``pods``."""
    if not kind:
        raise SourceError(f"a resource of {api_version!r} without a kind")
    singular = kind.lower()
    if singular.endswith(_UNPLURALIZED):
        plural = singular
    elif singular.endswith("s"):
        plural = singular + "es"
    elif singular.endswith("y"):
        plural = singular[:-1] + "ies"
    else:
        plural = singular + "s"
    return f"{api_version.strip('/')}/{plural}"


def selector_string(selector: Mapping[str, Any] | None) -> str:
    """A ``metav1.LabelSelector`` as the string the adapter gets (apimachinery's
    ``LabelSelectorAsSelector(...).String()``): requirements sorted by key, values of ``in`` and
    ``notin`` sorted; ``""`` (everything) for an absent or empty selector."""
    if not selector:
        return ""
    requirements: list[tuple[str, str]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        requirements.append((str(key), f"{key}={value}"))
    for expression in selector.get("matchExpressions") or []:
        key, operator = str(expression.get("key", "")), str(expression.get("operator", ""))
        values = sorted(str(v) for v in expression.get("values") or [])
        if operator not in _OPERATORS or not key:
            raise SourceError(f"not a valid label selector requirement: {expression!r}")
        if operator in ("In", "NotIn"):
            if not values:
                raise SourceError(f"{operator} needs values: {expression!r}")
            requirements.append((key, f"{key}{_OPERATORS[operator]}({','.join(values)})"))
        elif values:
            raise SourceError(f"{operator} takes no values: {expression!r}")
        else:
            requirements.append((key, key if operator == "Exists" else f"!{key}"))
    return ",".join(text for _, text in sorted(requirements, key=lambda r: r[0]))


@dataclass(frozen=True)
class SourceSpec:
    """What an ApiServerSource manifest asks its adapter to watch."""

    name: str
    namespace: str
    # Empty: every namespace (one cluster-wide watch).
    namespaces: tuple[str, ...]
    resources: tuple[str, ...]
    # One selector for every resource (all the local adapter runner supports).
    label_selector: str
    mode: str
    owner: Mapping[str, str] | None = None
    filters: tuple[Mapping[str, Any], ...] = ()


def from_manifest(path: str | Path = MANIFEST, name: str = MANIFEST_SOURCE) -> SourceSpec:
    """The ApiServerSource named ``name`` in ``path``, as its adapter would be configured."""
    docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if isinstance(d, dict)]
    found = [
        d
        for d in docs
        if d.get("kind") == "ApiServerSource" and (d.get("metadata") or {}).get("name") == name
    ]
    if len(found) != 1:
        raise SourceError(f"{path}: expected one ApiServerSource {name!r}, found {len(found)}")
    meta, spec = found[0].get("metadata") or {}, found[0].get("spec") or {}
    namespace = str(meta.get("namespace") or DEFAULT_NAMESPACE)
    if "namespaceSelector" not in spec or spec["namespaceSelector"] is None:
        namespaces: tuple[str, ...] = (namespace,)
    elif selector_string(spec["namespaceSelector"]) == "":
        namespaces = ()
    else:
        # The controller lists the matching namespaces once per reconcile; not reproduced here.
        raise SourceError(f"{name}: a namespaceSelector with labels is not supported locally")
    resources, selectors = [], set()
    for resource in spec.get("resources") or []:
        resources.append(guess_resource(str(resource.get("apiVersion", "")), resource.get("kind")))
        selectors.add(selector_string(resource.get("selector")))
    if not resources:
        raise SourceError(f"{name}: no resources")
    if len(selectors) != 1:
        raise SourceError(f"{name}: different selectors per resource are not supported locally")
    owner = spec.get("owner")
    return SourceSpec(
        name=name,
        namespace=namespace,
        namespaces=namespaces,
        resources=tuple(resources),
        label_selector=selectors.pop(),
        # The API's default (apiserver_defaults.go).
        mode=str(spec.get("mode") or "Reference"),
        owner={str(k): str(v) for k, v in owner.items()} if isinstance(owner, dict) else None,
        filters=tuple(spec.get("filters") or ()),
    )


def source_config(
    *,
    namespaces: Sequence[str] = (),
    resources: Sequence[str] = ("v1/pods",),
    mode: str = "Resource",
    label_selector: str = "",
    owner: Mapping[str, str] | None = None,
    filters: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """``K_SOURCE_CONFIG``: an empty ``namespaces`` means every namespace."""
    if mode not in ("Resource", "Reference"):
        raise ValueError(f"mode must be Resource or Reference, got {mode!r}")
    watches: list[dict[str, Any]] = []
    for resource in resources:
        watch: dict[str, Any] = {"gvr": gvr(resource)}
        if label_selector:
            watch["selector"] = label_selector
        watches.append(watch)
    config: dict[str, Any] = {
        "namespaces": list(namespaces),
        "allNamespaces": not namespaces,
        "resources": watches,
        "mode": mode,
    }
    if owner:
        config["owner"] = dict(owner)
    if filters:
        config["filters"] = [dict(f) for f in filters]
    return config


def _die_with_parent(parent: int) -> Callable[[], None]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def preexec() -> None:  # in the child, between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would kill us
            os._exit(1)

    return preexec


def _terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ApiServerSource:
    """Knative's ApiServerSource adapter as a local process: pod events to ``sink``.

    ``start()`` returns once every watch has listed (events flow from then on); ``stop()``
    sends SIGTERM, then SIGKILL after ``grace`` seconds. The process also dies with the
    thread that started it (PR_SET_PDEATHSIG) and at interpreter exit, so none is left
    behind; start it from a thread that lives as long as it should.
    """

    def __init__(
        self,
        kubeconfig: str | Path,
        sink: str,
        *,
        namespaces: Sequence[str] = (),
        resources: Sequence[str] = ("v1/pods",),
        mode: str = "Resource",
        label_selector: str = "",
        owner: Mapping[str, str] | None = None,
        filters: Sequence[Mapping[str, Any]] = (),
        name: str = "kn-rescheduler-pods",
        namespace: str = DEFAULT_NAMESPACE,
        log_path: str | Path | None = None,
        binary: str | Path | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.sink = sink
        self.name = name
        self.namespace = namespace
        self.label_selector = label_selector
        self.config = source_config(
            namespaces=namespaces,
            resources=resources,
            mode=mode,
            label_selector=label_selector,
            owner=owner,
            filters=filters,
        )
        # One reflector per resource, times one per namespace when namespaces are listed.
        self._reflectors = len(resources) * max(1, len(namespaces))
        self._binary = Path(binary) if binary else None
        # Wraps the command line, e.g. to run it in the stack's network namespace.
        self._wrap = wrap
        self._own_log_dir: tempfile.TemporaryDirectory[str] | None = None
        self._log_path = Path(log_path) if log_path else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @classmethod
    def from_manifest(
        cls,
        kubeconfig: str | Path,
        sink: str,
        *,
        manifest: str | Path = MANIFEST,
        source: str = MANIFEST_SOURCE,
        **kwargs: Any,
    ) -> ApiServerSource:
        """The adapter of the ApiServerSource ``source`` in ``manifest`` (by default the
        project's pod-events source): the same resources, label selector, namespaces and mode
        a cluster's would watch. ``kwargs`` go to the constructor (``log_path``, ``binary``)."""
        spec = from_manifest(manifest, source)
        return cls(
            kubeconfig,
            sink,
            namespaces=spec.namespaces,
            resources=spec.resources,
            mode=spec.mode,
            label_selector=spec.label_selector,
            owner=spec.owner,
            filters=spec.filters,
            name=spec.name,
            namespace=spec.namespace,
            **kwargs,
        )

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def environment(self) -> dict[str, str]:
        """The adapter's environment, as the ApiServerSource controller would set it."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/"),
            "K_SINK": self.sink,
            "NAME": self.name,
            "NAMESPACE": self.namespace,
            "SYSTEM_NAMESPACE": "knative-eventing",
            "K_SOURCE_CONFIG": json.dumps(self.config, separators=(",", ":")),
            "K_KLOG_VERBOSITY": "2",
            "PROFILING_PORT": "0",
        }

    def log_text(self) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            return
        binary = self._binary or adapter_binary()
        if self._log_path is None:
            self._own_log_dir = tempfile.TemporaryDirectory(prefix="apiserversource-")
            self._log_path = Path(self._own_log_dir.name) / "adapter.log"
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(binary), "--kubeconfig", str(self.kubeconfig)]
        if self._wrap is not None:
            argv = self._wrap(argv)
        with self._log_path.open("ab") as log:
            log.write(f"--- starting {binary.name}, sink {self.sink}\n".encode())
            log.flush()
            offset = log.tell()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
                # Only prctl and getppid run between fork and exec: no lock is taken there.
                preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509
            )
        self._finalizer = weakref.finalize(self, _terminate, self._proc, 5.0)
        deadline = time.monotonic() + timeout
        while True:
            text = self._log_path.read_bytes()[offset:].decode(errors="replace")
            if text.count(_READY_MARK) >= self._reflectors:
                return
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise SourceError(
                    f"adapter exited with {code} before it was ready:\n{text[-4000:]}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise SourceError(f"adapter not ready after {timeout:.0f} s:\n{text[-4000:]}")
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        if self._proc is not None:
            _terminate(self._proc, grace)
            self._proc = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._own_log_dir is not None:
            with contextlib.suppress(OSError):
                self._own_log_dir.cleanup()
            self._own_log_dir = None
            self._log_path = None

    def __enter__(self) -> ApiServerSource:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
