"""LocalRegistry's failures, without a registry: each says what went wrong and shows the log.

The registry itself, the images and a real push are tested in tests/e2e/test_node_images.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from dev.localcluster.registry import LocalRegistry, RegistryError, config


def test_config_serves_plain_http_on_loopback_from_the_directory(tmp_path: Path) -> None:
    cfg = config(tmp_path / "storage", 5123)
    assert cfg["http"]["addr"] == "127.0.0.1:5123"
    assert cfg["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "storage")
    assert "auth" not in cfg and "tls" not in cfg["http"]


def test_start_writes_the_config_and_reports_an_exit_with_the_log(tmp_path: Path) -> None:
    script = tmp_path / "fake-registry"
    script.write_text('#!/bin/sh\necho "configuration error in $2" >&2\nexit 3\n')
    script.chmod(0o755)
    reg = LocalRegistry(tmp_path / "reg", tmp_path / "logs", port=5123, binary=str(script))
    with pytest.raises(RegistryError, match="exited with code 3") as err:
        reg.start(time.monotonic() + 10.0)
    assert "configuration error in" in str(err.value)
    written = yaml.safe_load((tmp_path / "reg" / "config.yml").read_text())
    assert written["http"]["addr"] == "127.0.0.1:5123"
    assert reg.host == "127.0.0.1:5123" and reg.url == "http://127.0.0.1:5123"


def test_start_times_out_and_leaves_no_process(tmp_path: Path) -> None:
    script = tmp_path / "silent-registry"
    script.write_text("#!/bin/sh\necho listening nowhere\nexec sleep 60\n")
    script.chmod(0o755)
    reg = LocalRegistry(tmp_path / "reg", tmp_path / "logs", binary=str(script))
    with pytest.raises(RegistryError, match="timed out") as err:
        reg.start(time.monotonic() + 0.5)
    assert "listening nowhere" in str(err.value)
    assert reg.proc is None


def test_push_needs_a_running_registry(tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "reg", tmp_path / "logs")
    with pytest.raises(RegistryError, match="not running"):
        reg.push(tmp_path / "busybox.oci.tar", "busybox:1.35")
