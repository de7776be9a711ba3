"""A tar.gz that is the same bytes whenever it is made from the same files (release archives)."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Mapping


def deterministic_tgz(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    """A tar.gz of ``files`` (name: content and mode), entries in order, time 0, owner root,
    no name or time in the gzip header: the same bytes from the same files."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            data, mode = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0, filename="", compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()
