"""A kubeconfig whose credentials cannot be obtained is refused, not used as anonymous.

The Kubernetes client runs a kubeconfig user's exec credential plugin while loading the file;
when the plugin fails it logs the error and carries on with no credentials, so every call
would go out as system:anonymous. These run real exec plugins (a script, /bin/false).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shared.platform.kube import Kube, Unconfigured

CLUSTER = '{server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}'


def kubeconfig(tmp_path: Path, user: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {CLUSTER}}}]\n"
        f"users: [{{name: u, user: {user}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    return path


def exec_user(command: Path | str) -> str:
    return (
        "{exec: {apiVersion: client.authentication.k8s.io/v1, "
        f"command: {command}, interactiveMode: Never}}}}"
    )


def test_an_exec_plugin_that_fails_is_refused_saying_so(tmp_path: Path) -> None:
    with pytest.raises(Unconfigured, match="credentials could not be obtained: exec: process"):
        Kube.from_environment(kubeconfig=str(kubeconfig(tmp_path, exec_user("/bin/false"))))


def test_an_exec_plugin_that_answers_gives_its_token(tmp_path: Path) -> None:
    plugin = tmp_path / "credential"
    plugin.write_text(
        '#!/bin/sh\necho \'{"apiVersion": "client.authentication.k8s.io/v1", '
        '"kind": "ExecCredential", "status": {"token": "abc"}}\'\n'
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    kube = Kube.from_environment(kubeconfig=str(kubeconfig(tmp_path, exec_user(plugin))))
    assert "Bearer abc" in kube._api.configuration.api_key.values()


def test_a_user_with_no_credentials_at_all_is_taken_as_the_kubeconfig_says(
    tmp_path: Path,
) -> None:
    # A cluster that admits anonymous reads (a local one) is configured that way on purpose.
    kube = Kube.from_environment(kubeconfig=str(kubeconfig(tmp_path, "{}")))
    assert not kube._api.configuration.api_key
