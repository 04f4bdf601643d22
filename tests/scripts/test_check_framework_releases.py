"""scripts/check-framework-releases.sh, against a real HTTP server that speaks PyPI's JSON API."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sweep.frameworks.releases import RELEASES_CHECKED

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-framework-releases.sh"


class Index:
    """A package index whose newest release per package the test sets."""

    def __init__(self) -> None:
        self.newest = {check.package: check.newest for check in RELEASES_CHECKED}
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pypi"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = self.path.strip("/").split("/")
                version = index.newest.get(parts[1]) if len(parts) == 3 else None
                if version is None:
                    self.send_error(404)
                    return
                body = json.dumps({"info": {"version": version}, "releases": {
                    version: [{"upload_time": "2026-11-20T10:00:00"}]}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        return Handler


@pytest.fixture
def index() -> Iterator[Index]:
    served = Index()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


def check(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "--index-url", url, "--timeout", "5"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_an_index_with_nothing_newer_exits_zero_and_says_so_per_package(index: Index) -> None:
    done = check(index.url)
    assert done.returncode == 0, done.stderr
    for release in RELEASES_CHECKED:
        assert f"{release.package}: {release.newest} is the newest release" in done.stdout


def test_a_newer_release_exits_one_and_names_the_package_and_the_fix(index: Index) -> None:
    index.newest["torchtitan"] = "0.4.0"
    done = check(index.url)
    assert done.returncode == 1
    assert "torchtitan: 0.4.0 (2026-11-20) is newer than" in done.stdout
    assert "update sweep/frameworks/releases.py" in done.stdout
    assert "megatron-core: " in done.stdout  # every package is still reported


def test_an_older_release_on_a_mirror_is_not_newer(index: Index) -> None:
    index.newest["torch"] = "2.13.0"
    assert check(index.url).returncode == 0


def test_an_unreachable_index_exits_two_and_names_the_url(index: Index) -> None:
    index.newest.pop("nanotron")  # this package answers 404
    done = check(index.url)
    assert done.returncode == 2
    assert f"nanotron: cannot read {index.url}/nanotron/json" in done.stderr
