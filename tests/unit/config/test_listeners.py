"""MM2's `listeners` key: the REST address mm2py serves on unless --listen is given."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mm2py.config import ConfigError, load_config
from mm2py.config.listeners import Listener, parse_listener, rest_address

BASE = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"


@pytest.mark.parametrize(
    ("url", "listener"),
    [
        ("http://0.0.0.0:8083", Listener("http", "0.0.0.0", 8083)),
        ("HTTP://host.example:80", Listener("http", "host.example", 80)),
        ("http://:8083", Listener("http", "", 8083)),  # Connect's default: every interface
        ("http://[::1]:9000", Listener("http", "::1", 9000)),
        ("https://h:8443", Listener("https", "h", 8443)),
    ],
)
def test_listener_urls_parse_as_connect_reads_them(url: str, listener: Listener) -> None:
    assert parse_listener(url) == listener


def test_the_first_http_listener_is_the_address_and_the_rest_are_named() -> None:
    assert rest_address("http://:8083") == ("0.0.0.0:8083", [])
    assert rest_address(" https://a:8443 , http://b:8083,http://c:9") == (
        "b:8083",
        ["https://a:8443", "http://c:9"],
    )
    assert rest_address(["http://127.0.0.1:1234"]) == ("127.0.0.1:1234", [])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("https://a:8443", "plain HTTP only"),
        ("8083", "not a listener URL"),
        ("ftp://a:21", "unknown protocol 'ftp'"),
        ("http://a:70000", "port 70000 is out of range"),
        (" , ", "no listener given"),
    ],
)
def test_listeners_mm2py_cannot_serve_are_refused(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        rest_address(value)


def test_listeners_from_properties_and_yaml(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    props = tmp_path / "mm2.properties"
    props.write_text(BASE + "listeners = http://0.0.0.0:8084, https://x:8443\n")
    with caplog.at_level(logging.WARNING):
        assert load_config(props).listen == "0.0.0.0:8084"
    assert [r.getMessage() for r in caplog.records] == [
        f"{props}: listeners: mm2py serves only 0.0.0.0:8084; not served: https://x:8443"
    ]
    yaml = tmp_path / "mm2.yaml"
    yaml.write_text(
        "clusters:\n  A: {bootstrap.servers: 'a:9092'}\n  B: {bootstrap.servers: 'b:9092'}\n"
        "listeners: [http://127.0.0.1:9999]\n"
    )
    assert load_config(yaml).listen == "127.0.0.1:9999"
    plain = tmp_path / "plain.properties"
    plain.write_text(BASE)
    assert load_config(plain).listen is None


def test_an_unservable_listener_fails_the_load_naming_the_key(tmp_path: Path) -> None:
    props = tmp_path / "mm2.properties"
    props.write_text(BASE + "listeners = https://0.0.0.0:8443\n")
    with pytest.raises(ConfigError, match=r"mm2\.properties: listeners: mm2py serves"):
        load_config(props)
