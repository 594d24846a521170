"""Which image URLs the gateway may fetch, and which addresses it may fetch them from.

An image URL is a request to fetch something from wherever the fetcher runs: inside the
operator's network, beside its cloud's metadata service. So it is fetched only from a host that
`gateway.media.allowed_domains` names (a name, never an address: `127.0.0.1`, `2130706433`,
`0177.0.0.1` or `[::1]` are refused before any lookup), and only from public addresses, whatever
DNS answers for that name: loopback, private, shared, link-local (cloud metadata, 169.254.169.254),
unique-local, multicast, reserved and unspecified addresses are refused, and an IPv6 address
carrying an IPv4 one (mapped, 6to4, Teredo, NAT64) is judged by the IPv4 address it carries. The
fetcher (deployments/ingress/media_fetch.py) connects only to the addresses checked here and
checks every redirect as it checks the first URL.
"""

from __future__ import annotations

import copy
import ipaddress
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from core.config import MediaConfig
from policy.request.fields import fail

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "RESPONSES",
    "RemoteUrl",
    "address_refusal",
    "checked_url",
    "count_images",
    "host_allowed",
    "remote_image_urls",
    "with_inline_images",
]

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Not public, whatever a CPython patch release's `is_global` says of them (its tables changed
# within 3.11): IETF protocol assignments (Oracle Cloud's metadata is 192.0.0.192), shared
# address space, benchmarking, reserved, "this network", site-local, local-use NAT64.
_NOT_PUBLIC = tuple(
    ipaddress.ip_network(network)
    for network in (
        "0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "198.18.0.0/15", "240.0.0.0/4",
        "fec0::/10", "64:ff9b:1::/48",
    )
)  # fmt: skip


@dataclass(frozen=True)
class RemoteUrl:
    url: str
    scheme: str
    host: str  # lower case, IDNA-encoded
    port: int


def checked_url(url: str, where: str, media: MediaConfig) -> RemoteUrl:
    """`url` as the fetcher may ask for it, or the client's 400 naming `where`."""
    if not media.allowed_domains:
        fail(
            where,
            "must be a data URL (data:image/png;base64,...): this gateway fetches no images "
            "from the network unless its operator lists the host in "
            "gateway.media.allowed_domains; send the image's bytes inline",
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        fail(where, "is not a URL the gateway can read")
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        fail(where, "must be an http or https URL, or a data URL")
    if parts.username is not None or parts.password is not None:
        fail(where, "must not carry a user name or password")
    host = _host(parts.hostname or "", where)
    if not host_allowed(host, media.allowed_domains):
        fail(
            where,
            f"names the host {host!r}, which is not in gateway.media.allowed_domains "
            f"({', '.join(media.allowed_domains)}); send the image inline as a data URL",
        )
    return RemoteUrl(url, scheme, host, port or (443 if scheme == "https" else 80))


def _host(host: str, where: str) -> str:
    """A host name, never an address in any of the forms a resolver would take as one."""
    if not host:
        fail(where, "has no host")
    if _is_address(host):
        fail(where, "names an address; images are fetched only from hosts named in "
                    "gateway.media.allowed_domains")  # fmt: skip
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        fail(where, "has a host name that cannot be encoded")


def _is_address(host: str) -> bool:
    """An IP literal, or a form the C library reads as one (2130706433, 0177.0.0.1, 0x7f.1)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
        return True
    except OSError:
        return False


def host_allowed(host: str, patterns: tuple[str, ...]) -> bool:
    """Whether `host` is a name `patterns` list: itself, or under a `*.` one."""
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False


def address_refusal(address: str) -> str | None:
    """Why the fetcher may not connect to `address` (None: a public address)."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return f"{address} is not an address"
    carried = _carried_ipv4(ip)
    if carried is not None:
        ip = carried
    if not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_unspecified:
        return f"{address} is not a public address"
    if any(ip.version == network.version and ip in network for network in _NOT_PUBLIC):
        return f"{address} is not a public address"
    return None


def _carried_ipv4(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for: mapped, 6to4, Teredo's client, NAT64's."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


# Where each API carries an image URL: chat's `image_url` parts, Anthropic's `image` blocks with
# a `url` source, the Responses API's `input_image` parts (their `image_url` a string).
CHAT, ANTHROPIC, RESPONSES = "chat", "anthropic", "responses"


def remote_image_urls(payload: dict[str, Any], api: str) -> list[tuple[str, str]]:
    """Each image URL of a request body that is not inline (a data URL): where it is, and it."""
    return [(where, url) for where, url, _ in _places(payload, api)]


def with_inline_images(
    payload: dict[str, Any], api: str, fetched: Mapping[str, str]
) -> dict[str, Any]:
    """The body with each URL of `fetched` replaced by its image, a data URL, in the API's own
    shape (Anthropic's a base64 source)."""
    body = copy.deepcopy(payload)
    for _, url, place in _places(body, api):
        inline = fetched[url]
        if api == ANTHROPIC:
            head, _, data = inline.partition(",")
            kind = head.removeprefix("data:").removesuffix(";base64")
            place["source"] = {"type": "base64", "media_type": kind, "data": data}
        elif api == CHAT:
            place["image_url"] = {**place["image_url"], "url": inline}
        else:
            place["image_url"] = inline
    return body


def count_images(payload: dict[str, Any], api: str) -> int:
    """The images a request body carries, inline or by URL."""
    return sum(1 for _ in _images(payload, api))


def _places(payload: dict[str, Any], api: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, url, the part or block holding it) for each image URL not inline."""
    field = {CHAT: "image_url.url", ANTHROPIC: "source.url"}.get(api, "image_url")
    for where, part in _images(payload, api):
        url = _url_of(part, api)
        if isinstance(url, str) and url[:5].lower() != "data:":
            yield f"{where}.{field}", url, part


def _images(payload: dict[str, Any], api: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, part) for each image part or block of the body's messages (or input items)."""
    key = "input" if api == RESPONSES else "messages"
    items = payload.get(key)
    if not isinstance(items, list):
        return
    kind = {CHAT: "image_url", ANTHROPIC: "image"}.get(api, "input_image")
    for i, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == kind:
                yield f"{key}[{i}].content[{j}]", part


def _url_of(part: dict[str, Any], api: str) -> Any:
    if api == CHAT:
        media = part.get("image_url")
        return media.get("url") if isinstance(media, dict) else None
    if api == ANTHROPIC:
        source = part.get("source")
        return (
            source.get("url") if isinstance(source, dict) and source.get("type") == "url" else None
        )
    return part.get("image_url")
