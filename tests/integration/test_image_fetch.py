"""The gateway's fetch of images by URL (gateway.media.allowed_domains), against real HTTP.

A recording server runs in a network namespace this test makes, on 11.77.0.2: a public address
(the fetcher refuses every other kind), reached over a veth pair. Names resolve through an
injected resolver, as DNS would answer them; the address guard itself has no switch. A second
recording server listens on this machine's loopback, where nothing may ever arrive: every URL
that names it, in any form, directly, through a name or through a redirect, is refused before a
connection is made.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from core.config import MediaConfig
from core.errors import ApiError
from core.types import Role
from deployments.ingress.app import Ingress
from deployments.ingress.media_fetch import ImageFetcher
from deployments.router.adapters.in_process import InProcessRouter
from tests.fakes.router_harness import FakeBackend, dead, make_config, make_router, ok
from tests.integration import recording_server

PUBLIC = "11.77.0.2"  # the namespace's side of the veth pair
PORT = 8080
ROOT = Path(__file__).resolve().parents[2]


class Servers:
    def __init__(self, public_log: Path, loopback_log: Path, loopback_port: int) -> None:
        self.public_log = public_log
        self.loopback_log = loopback_log
        self.loopback_port = loopback_port

    def hits(self) -> tuple[list[str], list[str]]:
        """What each server was asked for since the last call, and forget it."""
        out = []
        for log in (self.public_log, self.loopback_log):
            out.append(log.read_text().split() if log.exists() else [])
            log.write_text("")
        return out[0], out[1]


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    folder = tmp_path_factory.mktemp("fetch")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        loopback_port = probe.getsockname()[1]
    loopback = recording_server.serve("127.0.0.1", loopback_port, str(folder / "loopback.log"))
    threading.Thread(target=loopback.serve_forever, daemon=True).start()
    pid = os.getpid() % 100_000
    namespace, host_end, ns_end = f"gpsimg{pid}", f"gph{pid}", f"gpn{pid}"
    try:
        run("ip", "netns", "add", namespace)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.fail(f"this test makes a network namespace (root, iproute2): {error}")
    server = None
    try:
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        run("ip", "link", "set", ns_end, "netns", namespace)
        run("ip", "addr", "add", "11.77.0.1/30", "dev", host_end)
        run("ip", "link", "set", host_end, "up")
        inside = ("ip", "netns", "exec", namespace)
        run(*inside, "ip", "addr", "add", f"{PUBLIC}/30", "dev", ns_end)
        run(*inside, "ip", "link", "set", ns_end, "up")
        away = f"http://127.0.0.1:{loopback_port}/red.png"
        script = str(ROOT / "tests" / "integration" / "recording_server.py")
        log = str(folder / "public.log")
        server = subprocess.Popen(
            [*inside, sys.executable, script, PUBLIC, str(PORT), log, away],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "serving"
        yield Servers(folder / "public.log", folder / "loopback.log", loopback_port)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
            if server.stdout is not None:
                server.stdout.close()
        subprocess.run(["ip", "netns", "del", namespace], check=False)  # its veth end goes too
        subprocess.run(["ip", "link", "del", host_end], check=False, capture_output=True)
        loopback.shutdown()
        loopback.server_close()


# What DNS would answer for each name.
NAMES = {
    "images.gps.test": [PUBLIC],
    "private.gps.test": ["127.0.0.1"],
    "rebind.gps.test": [PUBLIC, "127.0.0.1"],  # one answer public, one not
    "metadata.gps.test": ["169.254.169.254"],
    "mapped.gps.test": ["::ffff:127.0.0.1"],
}
MEDIA = MediaConfig(allowed_domains=("*.gps.test",), max_image_bytes=1024 * 1024)


async def resolve(host: str, port: int) -> list[str]:
    if host not in NAMES:
        raise OSError(f"{host}: no such name")
    return NAMES[host]


def refused(url: str) -> ApiError:
    with pytest.raises(ApiError) as raised:
        asyncio.run(ImageFetcher(MEDIA, resolve).fetch(url, "messages[0].content[0]"))
    assert raised.value.status == 400
    assert raised.value.param == "messages[0].content[0]"
    return raised.value


def test_an_allowed_host_is_fetched_once_and_the_engines_get_its_bytes_through_a_failover(
    servers: Servers,
) -> None:
    servers.hits()
    config = make_config(images_on=("coding", "orchestrator"))
    config = config.model_copy(
        update={"gateway": config.gateway.model_copy(update={"media": MEDIA})}
    )
    coding, orchestrator = FakeBackend(dead), FakeBackend(ok)
    router = make_router(config, {"coding@local": coding, "orchestrator@local": orchestrator})
    ingress = Ingress(config, InProcessRouter(router), resolve=resolve)
    url = f"http://images.gps.test:{PORT}/red.png"
    body = {
        "model": Role.CODING.value,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is this?"},
        ]}],
        "max_tokens": 8,
        "stream": True,
    }  # fmt: skip

    async def streamed() -> Any:
        response = await ingress.chat(http_request(body))
        assert isinstance(response, StreamingResponse)
        async for _ in response.body_iterator:
            pass
        return response

    response = asyncio.run(streamed())
    assert response.status_code == 200
    assert response.headers["x-backend"] == "orchestrator@local"
    assert response.headers["x-failovers"] == "1"
    inline = "data:image/png;base64," + base64.b64encode(recording_server.red_png()).decode()
    for backend in (coding, orchestrator):  # each link got the bytes, neither the URL
        [part, _] = backend.requests[-1].messages[0]["content"]
        assert part["image_url"]["url"] == inline
    assert servers.hits() == (["/red.png"], [])  # fetched once, by the gateway


def test_addresses_that_are_not_public_are_never_reached_in_any_form(servers: Servers) -> None:
    servers.hits()
    port = servers.loopback_port
    for url in (
        f"http://127.0.0.1:{port}/red.png",
        f"http://localhost:{port}/red.png",
        f"http://[::1]:{port}/red.png",
        f"http://[::ffff:127.0.0.1]:{port}/red.png",
        "http://169.254.169.254/latest/meta-data/",
        f"http://2130706433:{port}/red.png",  # 127.0.0.1 as one decimal number
        f"http://0177.0.0.1:{port}/red.png",  # and in octal
        f"http://0x7f.1:{port}/red.png",
    ):
        error = refused(url)
        assert "allowed_domains" in error.message or "names an address" in error.message, url
    for name in ("private", "rebind", "metadata", "mapped"):
        error = refused(f"http://{name}.gps.test:{port}/red.png")
        assert "not a public address" in error.message
    assert "not in gateway.media.allowed_domains" in refused("http://example.com/a.png").message
    assert "user name" in refused(f"http://images.gps.test@127.0.0.1:{port}/").message
    assert servers.hits() == ([], [])  # no connection was made to either


def test_each_redirect_is_checked_as_the_first_url(servers: Servers) -> None:
    servers.hits()
    error = refused(f"http://images.gps.test:{PORT}/redirect-away")  # to 127.0.0.1
    assert "names an address" in error.message
    assert servers.hits() == (["/redirect-away"], [])
    fetched = asyncio.run(
        ImageFetcher(MEDIA, resolve).fetch(f"http://images.gps.test:{PORT}/redirect-home", "x")
    )
    assert fetched.startswith("data:image/png;base64,")
    assert servers.hits() == (["/redirect-home", "/red.png?again"], [])
    assert "not a URL" in refused(f"http://images.gps.test:{PORT}/redirect-broken").message
    none_allowed = MediaConfig(allowed_domains=("*.gps.test",), max_redirects=0)
    with pytest.raises(ApiError, match="redirects more than 0 times"):
        asyncio.run(
            ImageFetcher(none_allowed, resolve).fetch(
                f"http://images.gps.test:{PORT}/redirect-home", "x"
            )
        )


def test_what_is_not_an_image_or_is_too_large_is_a_400(servers: Servers) -> None:
    assert "not an image" in refused(f"http://images.gps.test:{PORT}/page").message
    assert "larger than 1048576 bytes" in refused(f"http://images.gps.test:{PORT}/big.png").message
    assert "HTTP 404" in refused(f"http://images.gps.test:{PORT}/missing.png").message
    off = ImageFetcher(MediaConfig(), resolve)
    with pytest.raises(ApiError, match="unless its operator lists the host"):
        asyncio.run(off.fetch(f"http://images.gps.test:{PORT}/red.png", "x"))


def test_the_limit_counts_inline_images_too_and_nothing_is_fetched_past_it(
    servers: Servers,
) -> None:
    servers.hits()
    inline = "data:image/png;base64," + base64.b64encode(recording_server.red_png()).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}
             for url in (inline, inline, f"http://images.gps.test:{PORT}/red.png")]  # fmt: skip
    body = {"model": "coding", "messages": [{"role": "user", "content": parts}]}
    two = MediaConfig(allowed_domains=("*.gps.test",), max_images_per_request=2)
    with pytest.raises(ApiError, match="carries 3 images"):
        asyncio.run(ImageFetcher(two, resolve).inline(body, "chat"))
    assert servers.hits() == ([], [])


def http_request(body: dict[str, Any]) -> Request:
    payload = json.dumps(body).encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "query_string": b"", "headers": []}  # fmt: skip
    chunks = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop() if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)
