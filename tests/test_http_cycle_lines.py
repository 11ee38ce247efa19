"""HopCycle's answer heads (nemo_gym/serving/http_cycle.py): header lines kept from one answer to
the next are the same bytes, framing headers are read on every answer, and a bad value is refused
every time it is sent."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_gym.serving import http_cycle
from nemo_gym.serving.http_cycle import HopCycle, default_header_lines


class _State:
    default_headers = [(b"date", b"Sun, 29 Nov 2026 03:00:00 GMT"), (b"server", b"uvicorn")]


class _Protocol:
    """What ``HopCycle._begin`` reads of its protocol."""

    server_state = _State()
    access_log = False
    _ng_defaults: Any = None
    _ng_lead: bytes | None = None

    def _ng_take_defaults(self, defaults: list[tuple[bytes, bytes]]) -> None:
        self._ng_defaults = defaults
        self._ng_lead = default_header_lines(defaults)


def _head(headers: Any, method: str = "POST", status: int = 200) -> tuple[bytes, HopCycle]:
    cycle = HopCycle.__new__(HopCycle)
    cycle.protocol = _Protocol()
    cycle.scope = {"method": method}
    cycle.keep_alive = True
    cycle.chunked_encoding = None
    cycle.expected_content_length = 0
    cycle._begin(status, headers)
    assert cycle.head is not None
    return cycle.head, cycle


LEAD = b"HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 03:00:00 GMT\r\nserver: uvicorn\r\n"


def test_the_same_head_on_every_answer_and_framing_read_each_time() -> None:
    for length in (b"7", b"12345", b"7"):
        head, cycle = _head([(b"Content-Type", b"application/json"), (b"content-length", length)])
        assert head == LEAD + b"content-type: application/json\r\ncontent-length: " + length + b"\r\n\r\n"
        assert cycle.expected_content_length == int(length) and cycle.chunked_encoding is False
    # A list pair (not hashable) and a tuple pair give the same line.
    head, _ = _head([[b"content-type", b"application/json"], (b"content-length", b"2")])
    assert head == LEAD + b"content-type: application/json\r\ncontent-length: 2\r\n\r\n"
    assert (b"content-length", b"7") not in http_cycle._LINES


def test_connection_close_and_chunked_are_seen_on_every_answer() -> None:
    for _ in range(2):
        head, cycle = _head([(b"connection", b"close"), (b"content-length", b"0")])
        assert cycle.keep_alive is False and head.endswith(b"connection: close\r\ncontent-length: 0\r\n\r\n")
        head, cycle = _head([(b"transfer-encoding", b"chunked")])
        assert cycle.chunked_encoding is True and head.endswith(b"transfer-encoding: chunked\r\n\r\n")


@pytest.mark.parametrize(
    "header",
    [(b"x-bad", b"a\r\nx-injected: yes"), (b"x-bad", b"a\nb"), (b"x-bad", b"a\x00b"), (b"x-bad", b"a\rb")],
)
def test_a_bad_value_is_refused_every_time(header: tuple[bytes, bytes]) -> None:
    for _ in range(3):
        with pytest.raises(RuntimeError, match="Invalid HTTP header value"):
            _head([header, (b"content-length", b"0")])
    assert header not in http_cycle._LINES


def test_a_bad_name_is_refused_and_cookies_are_not_kept() -> None:
    with pytest.raises(RuntimeError, match="Invalid HTTP header name"):
        _head([(b"x bad", b"v")])
    head, _ = _head([(b"set-cookie", b"session=secret"), (b"content-length", b"0")])
    assert b"set-cookie: session=secret\r\n" in head
    assert (b"set-cookie", b"session=secret") not in http_cycle._LINES


@pytest.mark.parametrize("length", [b"5\r\n", b"5\r\nx-injected: yes", b" 5\n"])
def test_a_content_length_with_a_line_end_is_refused(length: bytes) -> None:
    _head([(b"content-type", b"application/json"), (b"content-length", b"5")])  # its line kept
    with pytest.raises((RuntimeError, ValueError), match="Invalid HTTP header value|invalid literal"):
        _head([(b"content-type", b"application/json"), (b"content-length", length)])


def test_a_content_length_that_int_reads_is_sent_as_given() -> None:
    head, cycle = _head([(b"content-length", b"+5")])
    assert head.endswith(b"content-length: +5\r\n\r\n") and cycle.expected_content_length == 5
