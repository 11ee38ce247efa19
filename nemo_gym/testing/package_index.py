"""A Python package index on loopback, wheels built for it, and environments for ``pip`` to install into.

Tests of ``gym env pull`` let real ``pip`` subprocesses download and install: a ``nemo-gym``
release and its dependencies are wheels built here (:func:`build_wheel`, :func:`dist_info`),
served by a PEP 503 simple index on 127.0.0.1 (:func:`package_index`, pointed at with
:func:`pip_env`), and installed into a virtual environment layered on this one
(:func:`layered_python`), never into the environment running the tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def build_wheel(path: Path, files: Mapping[str, str]) -> Path:
    """A wheel at ``path`` holding ``files`` (text by path inside the wheel); its path."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def dist_info(
    dist: str,
    version: str,
    requires: Sequence[str] = (),
    requires_python: str | None = None,
    license_text: str | None = None,
) -> dict[str, str]:
    """The ``.dist-info`` files of distribution ``dist`` ``version`` (Apache-2.0), with its
    ``Requires-Dist`` lines, its ``Requires-Python`` and a licence file when given."""
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    python = f"Requires-Python: {requires_python}\n" if requires_python else ""
    lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.4\nName: {dist}\nVersion: {version}\n"
        f"License-Expression: Apache-2.0\n{python}{lines}",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    if license_text is not None:
        files[f"{info}/licenses/LICENSE"] = license_text
    return files


@contextlib.contextmanager
def package_index(projects: Mapping[str, Sequence[Path]]) -> Iterator[str]:
    """Serve ``projects`` (distribution name to its wheel files) as a PEP 503 simple index on a
    free loopback port, in a background thread; yields the index URL (``.../simple/``)."""
    files = {wheel.name: wheel for wheels in projects.values() for wheel in wheels}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            body: bytes | None = None
            kind = "text/html"
            if len(parts) == 2 and parts[0] == "simple" and parts[1] in projects:
                links = "".join(
                    f'<a href="/files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>'
                    for w in projects[parts[1]]
                )
                body = f"<html><body>{links}</body></html>".encode()
            elif len(parts) == 2 and parts[0] == "files" and parts[1] in files:
                body, kind = files[parts[1]].read_bytes(), "application/octet-stream"
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def pip_env(index_url: str, **extra: str) -> dict[str, str]:
    """This process's environment with pip pointed at ``index_url`` only (trusted, no cache),
    plus ``extra`` variables."""
    host = index_url.split("/")[2].split(":")[0]
    return dict(
        os.environ,
        PIP_INDEX_URL=index_url,
        PIP_TRUSTED_HOST=host,
        PIP_NO_CACHE_DIR="1",
        **extra,
    )


def site_packages_of_this_python() -> list[str]:
    """The ``site-packages`` directories this interpreter imports from."""
    return [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]


def layered_python(root: Path, below: Sequence[str] | None = None) -> Path:
    """A virtual environment at ``root`` whose packages sit on ``below`` (a ``.pth`` file;
    default: this interpreter's site-packages), so that pip installs go into it only; its
    ``python``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = next((root / "lib").glob("python*/site-packages"))
    layers = site_packages_of_this_python() if below is None else list(below)
    (site / "_base.pth").write_text("\n".join(layers) + "\n")
    return root / "bin" / "python"
