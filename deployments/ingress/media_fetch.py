"""The gateway's own fetch of images by URL (`gateway.media.allowed_domains`), once per request,
before it is routed: the engines get the bytes, as a data URL, so a failover fetches nothing
again and no engine reaches out to the network.

Each hop (the URL, then each redirect, up to `max_redirects`) is checked as policy/request/
remote_images.py says: an allowed name, resolved here once, every address it resolves to
public; the connection goes to those addresses only (aiohttp is handed them as its resolver's
answer: no second lookup a DNS rebinding could change), with the name for TLS and Host. The
body is read up to `max_image_bytes`, within `fetch_timeout_s` for the whole fetch; anything
else is the client's 400 naming the field. Proxies from the environment are not used.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urljoin

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from core.config import MediaConfig
from policy.request.fields import fail
from policy.request.images import check_image_count
from policy.request.remote_images import (
    RESPONSES,
    address_refusal,
    checked_url,
    count_images,
    remote_image_urls,
    with_inline_images,
)

__all__ = ["ImageFetcher", "Resolve", "system_resolve"]

Resolve = Callable[[str, int], Awaitable[list[str]]]  # host, port -> addresses
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system's resolver gives for `host`."""
    loop = asyncio.get_running_loop()
    answers = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in answers))


class ImageFetcher:
    def __init__(self, media: MediaConfig, resolve: Resolve = system_resolve) -> None:
        self._media = media
        self._resolve = resolve

    async def inline(self, payload: dict[str, Any], api: str) -> dict[str, Any]:
        """The body with each image URL replaced by the image it names, fetched once."""
        places = remote_image_urls(payload, api)
        if not places:
            return payload
        # Inline ones too, before anything is fetched: all of them are the limit's.
        param = "input" if api == RESPONSES else "messages"
        check_image_count(count_images(payload, api), self._media, param)
        first = {url: where for where, url in reversed(places)}
        tasks = {url: asyncio.ensure_future(self.fetch(url, where)) for url, where in first.items()}
        try:
            fetched = {url: await task for url, task in tasks.items()}
        finally:  # one refused (the client's 400 at once): the others stop, not run on unread
            for task in tasks.values():
                task.cancel()
        return with_inline_images(payload, api, fetched)

    async def fetch(self, url: str, where: str) -> str:
        """The image at `url` as a data URL, or the client's 400 naming `where`."""
        try:
            async with asyncio.timeout(self._media.fetch_timeout_s):
                return await self._follow(url, where)
        except TimeoutError:
            fail(where, f"could not be fetched within {self._media.fetch_timeout_s:g} s "
                        "(gateway.media.fetch_timeout_s)")  # fmt: skip
        except (aiohttp.ClientError, ValueError) as error:  # yarl's refusal of a URL too
            fail(where, f"could not be fetched: {type(error).__name__}")

    async def _follow(self, url: str, where: str) -> str:
        for _ in range(self._media.max_redirects + 1):
            target = checked_url(url, where, self._media)
            addresses = await self._addresses(target.host, target.port, where)
            connector = aiohttp.TCPConnector(
                resolver=_Pinned({target.host: addresses}), use_dns_cache=False, force_close=True
            )
            async with (
                aiohttp.ClientSession(connector=connector, trust_env=False) as session,
                session.get(url, allow_redirects=False, headers={"Accept": "image/*"}) as reply,
            ):
                if reply.status in _REDIRECTS and "Location" in reply.headers:
                    url = _joined(url, reply.headers["Location"], where)
                    continue
                if reply.status != 200:
                    fail(where, f"could not be fetched: HTTP {reply.status}")
                return await self._image(reply, where)
        fail(where, f"redirects more than {self._media.max_redirects} times "
                    "(gateway.media.max_redirects)")  # fmt: skip

    async def _addresses(self, host: str, port: int, where: str) -> list[str]:
        try:
            addresses = await self._resolve(host, port)
        except OSError:
            addresses = []
        if not addresses:
            fail(where, f"names the host {host!r}, which does not resolve")
        for address in addresses:
            refusal = address_refusal(address)
            if refusal is not None:
                fail(where, f"names the host {host!r}, which resolves to {refusal}; images are "
                            "fetched from public addresses only")  # fmt: skip
        return addresses

    async def _image(self, reply: aiohttp.ClientResponse, where: str) -> str:
        kind = reply.content_type
        if not kind.startswith("image/"):
            fail(where, f"is {kind or 'untyped'}, not an image")
        limit = self._media.max_image_bytes
        if (reply.content_length or 0) > limit:
            fail(where, f"is larger than {limit} bytes (gateway.media.max_image_bytes)")
        body = bytearray()
        async for chunk in reply.content.iter_chunked(64 * 1024):
            body += chunk
            if len(body) > limit:
                fail(where, f"is larger than {limit} bytes (gateway.media.max_image_bytes)")
        return f"data:{kind};base64,{base64.b64encode(body).decode()}"


def _joined(url: str, location: str, where: str) -> str:
    """A redirect's target, or the client's 400 where it is not a URL (`http://[::1`)."""
    try:
        return urljoin(url, location)
    except ValueError:
        fail(where, "redirects to something that is not a URL")


class _Pinned(AbstractResolver):
    """aiohttp's resolver answering with the addresses already checked, and nothing else."""

    def __init__(self, checked: Mapping[str, list[str]]) -> None:
        self._checked = checked

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = self._checked.get(host)
        if addresses is None:
            raise OSError(f"{host} was not checked")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        pass
