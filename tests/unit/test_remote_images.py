"""Which image URLs the gateway may fetch, from which addresses, and where each API carries them
(policy.request.remote_images). The fetch itself, over real HTTP: tests/integration/
test_image_fetch.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.config import MediaConfig
from core.errors import ApiError
from policy.request.remote_images import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    address_refusal,
    checked_url,
    host_allowed,
    remote_image_urls,
    with_inline_images,
)

MEDIA = MediaConfig(allowed_domains=("images.example.com", "*.cdn.example.org"))
INLINE = "data:image/png;base64,iVBORw0KGgo="


def test_only_the_listed_hosts_by_name_are_fetched_from() -> None:
    assert host_allowed("images.example.com", MEDIA.allowed_domains)
    assert host_allowed("a.b.cdn.example.org", MEDIA.allowed_domains)
    assert not host_allowed("cdn.example.org", MEDIA.allowed_domains)  # `*.` is its subdomains
    assert not host_allowed("images.example.com.evil.net", MEDIA.allowed_domains)
    assert not host_allowed("evilimages.example.com", MEDIA.allowed_domains)
    target = checked_url("https://Images.Example.com/a.png", "x", MEDIA)
    assert (target.host, target.port, target.scheme) == ("images.example.com", 443, "https")
    for address in ("127.0.0.1", "localhost", "::1", "[::1]", "2130706433"):
        with pytest.raises(ValidationError):
            MediaConfig(allowed_domains=(address,))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://images.example.com/a.png", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("http://user:pw@images.example.com/a.png", "user name"),
        ("http://images.example.com@127.0.0.1/a.png", "user name"),
        ("http://127.0.0.1/a.png", "names an address"),
        ("http://[::ffff:127.0.0.1]/a.png", "names an address"),
        ("http://2130706433/a.png", "names an address"),
        ("http://0177.0.0.1/a.png", "names an address"),
        ("http://0x7f000001/a.png", "names an address"),
        ("http://localhost/a.png", "not in gateway.media.allowed_domains"),
        ("http://metadata.google.internal/a.png", "not in gateway.media.allowed_domains"),
        ("http://images.example.com:99999/a.png", "not a URL"),
    ],
)
def test_urls_it_may_not_fetch_are_the_clients_400_naming_the_field(url: str, said: str) -> None:
    with pytest.raises(ApiError) as refused:
        checked_url(url, "messages[0].content[1].image_url.url", MEDIA)
    assert refused.value.status == 400
    assert refused.value.param == "messages[0].content[1].image_url.url"
    assert said in refused.value.message


def test_with_no_host_listed_every_url_is_refused_saying_how_to_allow_one() -> None:
    with pytest.raises(ApiError, match=r"gateway\.media\.allowed_domains"):
        checked_url("https://images.example.com/a.png", "x", MediaConfig())


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254",
        "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "::", "fc00::1", "fd00:ec2::254",
        "fe80::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::1", "64:ff9b::a00:1",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, its client 127.0.0.1
        "198.51.100.7", "192.0.0.192", "198.18.0.1", "fec0::1", "64:ff9b:1::a00:1",
        "not an address",
    ],
)  # fmt: skip
def test_addresses_that_are_not_public_are_refused(address: str) -> None:
    assert address_refusal(address) is not None


@pytest.mark.parametrize(
    "address",
    ["11.77.0.2", "8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808"],
)
def test_public_addresses_are_not(address: str) -> None:
    assert address_refusal(address) is None


def test_each_api_s_image_urls_are_found_and_replaced_in_its_own_shape() -> None:
    url = "https://images.example.com/a.png"
    chat: dict[str, Any] = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
        {"type": "image_url", "image_url": {"url": INLINE}},
    ]}]}  # fmt: skip
    assert remote_image_urls(chat, CHAT) == [("messages[0].content[1].image_url.url", url)]
    inlined = with_inline_images(chat, CHAT, {url: INLINE})
    assert inlined["messages"][0]["content"][1]["image_url"] == {"url": INLINE, "detail": "low"}
    assert chat["messages"][0]["content"][1]["image_url"]["url"] == url  # the body as sent

    anthropic: dict[str, Any] = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": url}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
    ]}]}  # fmt: skip
    assert remote_image_urls(anthropic, ANTHROPIC) == [("messages[0].content[0].source.url", url)]
    source = with_inline_images(anthropic, ANTHROPIC, {url: INLINE})["messages"][0]["content"][0]
    assert source["source"] == {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}

    responses: dict[str, Any] = {"input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": url}]}
    ]}  # fmt: skip
    assert remote_image_urls(responses, RESPONSES) == [("input[0].content[0].image_url", url)]
    part = with_inline_images(responses, RESPONSES, {url: INLINE})["input"][0]["content"][0]
    assert part == {"type": "input_image", "image_url": INLINE}
    assert remote_image_urls({"input": "just text"}, RESPONSES) == []
