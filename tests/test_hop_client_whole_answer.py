"""The hop client's one-go answer reader (``parse_whole_answer``) against httptools' parser: an
answer it reads is read exactly as the parser reads it (status, headers, body, cookies, the
connection kept open); anything outside its strict form is left to the parser; and on a real
loopback server, answers in one piece, in pieces, pipelined or closing read the same."""

from __future__ import annotations

import asyncio
import random
import re
from http.cookies import SimpleCookie

import httptools
import pytest

from nemo_gym.serving import hop_client

pytestmark = pytest.mark.timeout(60)


class _Reference:
    """What httptools' parser makes of some bytes (the hop client's slow path)."""

    def __init__(self, data: bytes) -> None:
        self.messages: list[tuple[int, list[tuple[bytes, bytes]], bytes, bool]] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.complete_at_end = False
        self.parser = httptools.HttpResponseParser(self)
        self.error: Exception | None = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = exc

    def on_message_begin(self) -> None:
        self.headers, self.parts = [], []
        self.complete_at_end = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.messages.append((status, self.headers, b"".join(self.parts), self.parser.should_keep_alive()))
        self.complete_at_end = True


def _cookies_of(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    jar: dict[str, str] = {}
    for name, value in headers:
        if name.lower() == b"set-cookie":
            cookie: SimpleCookie = SimpleCookie()
            cookie.load(value.decode("latin-1"))
            jar.update({key: morsel.value for key, morsel in cookie.items()})
    return jar


def _check(data: bytes) -> bool:
    """Assert the one-go reader agrees with httptools on ``data``; True when it read it."""
    answer = hop_client.parse_whole_answer(data)
    if answer is None:
        return False
    reference = _Reference(data)
    assert reference.error is None, data
    assert len(reference.messages) == 1 and reference.complete_at_end, data
    status, headers, body, keep_alive = reference.messages[0]
    assert keep_alive, data
    assert "raw_headers" not in vars(answer), data  # the header lines are parsed when asked for
    names = [key.decode("latin-1") for key, _ in headers] + ["Set-Cookie", "absent"]
    for name in names + ["a b", "x\r\ny", "content-type: application/json\r\nx"]:
        if name == "a b":  # names that are no header token are looked for in the parsed lines
            assert "raw_headers" not in vars(answer), data  # the others in the block itself
        wanted = [value for key, value in headers if key.lower() == name.lower().encode("latin-1")]
        expected = wanted[-1].decode("latin-1") if wanted else None  # the last one wins
        assert answer.header(name) == expected == answer.header(name.upper()), (name, data)
    assert answer.cookies == _cookies_of(headers), data  # (the cookies first: from the lines too)
    assert (answer.status, answer.raw_headers, answer.body) == (status, headers, body), data
    assert answer.cookies == _cookies_of(headers), data
    return True


OURS = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


def test_the_answers_our_servers_write_are_read_in_one_go() -> None:
    assert _check(OURS)
    assert _check(
        b"HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 03:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-length: 2\r\ncontent-type: application/json\r\n"
        b"set-cookie: session_id=abc123; HttpOnly; Path=/; SameSite=strict\r\n\r\n{}"
    )
    assert _check(b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 0\r\n\r\n")
    assert _check(b"HTTP/1.1 500 \r\nCONTENT-LENGTH: 003\r\nX-A: b: c\r\n\r\nabc")


@pytest.mark.parametrize(
    "data",
    [
        OURS[:-1],  # the body not all here yet
        OURS + b"HTTP/1.1 200 OK\r\n",  # a second answer behind it (never mixed in)
        OURS + b"x",
        OURS.replace(b"HTTP/1.1", b"HTTP/1.0"),
        OURS.replace(b"200 OK", b"204 No Content"),
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n" + OURS,
        OURS.replace(b"content-length: 11", b"transfer-encoding: chunked")[:-11] + b"b\r\n{}\r\n0\r\n\r\n",
        OURS.replace(b"content-type", b"connection: close\r\ncontent-type"),
        OURS.replace(b"content-type", b"Connection: keep-alive\r\ncontent-type"),
        OURS.replace(b"content-type", b"Upgrade: h2c\r\ncontent-type"),
        OURS.replace(b"content-type", b"Proxy-Connection: close\r\ncontent-type"),
        OURS.replace(b"content-type", b"Content-Length: 11\r\ncontent-type"),  # two lengths
        OURS.replace(b"content-length: 11", b"content-length: 12"),
        OURS.replace(b"content-length: 11", b"content-length: +11"),
        OURS.replace(b"content-length: 11", b"content-length:11"),
        OURS.replace(b"content-length: 11", b"content-length : 11"),
        OURS.replace(b"content-length: 11", b"content-length: 11 "),
        OURS.replace(b"content-length: 11", b"content-length:  11"),
        OURS.replace(b"content-length: 11", b"content-length: " + b"0" * 17 + b"11"),
        OURS.replace(b"json", b"json\t"),
        OURS.replace(b"json", b"js\ton"),
        OURS.replace(b"json", b"js\xc3\xa9on"),
        OURS.replace(b"json", b"json\r\n more"),  # a folded line
        OURS.replace(b"content-type: application/json", b"content-type:"),
        OURS.replace(b"content-type", b"content type"),
        OURS.replace(b"\r\n", b"\n"),
        OURS.replace(b"200 OK", b"200 O\x01K"),
        OURS.replace(b"200 OK", b"200"),
        OURS.replace(b"200", b"2000"),
        b"",
        b"HTTP/1.1 200 OK\r\n",
    ],
)
def test_anything_outside_the_strict_form_is_left_to_the_parser(data: bytes) -> None:
    assert not _check(data)


# The strict form spelled without possessive quantifiers (as it was first written): the reader's
# pattern must accept exactly the answers this one does.
_PLAIN_LINE = (
    rb"(?!(?i:content-length|transfer-encoding|connection|proxy-connection|upgrade):)"
    rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+: [!-~](?:[ -~]*[!-~])?\r\n"
)
_PLAIN_HEAD = re.compile(
    rb"HTTP/1\.1 ((?!204|304)[2-9][0-9][0-9]) [ -~]*\r\n((?:"
    + _PLAIN_LINE
    + rb")*(?i:content-length): ([0-9]{1,18})\r\n(?:"
    + _PLAIN_LINE
    + rb")*)\r\n"
)


def _plainly_whole(data: bytes) -> bool:
    match = _PLAIN_HEAD.match(data)
    return match is not None and len(data) - match.end() == int(match[3])


def test_random_heads_read_in_one_go_are_read_as_the_parser_reads_them() -> None:
    rng = random.Random(36)
    names = [b"content-type", b"Content-Length", b"set-cookie", b"Set-Cookie", b"x-y", b"date", b"Connection"]
    names += [b"transfer-encoding", b"upgrade", b"a!#$%&'*+-.^_`|~z", b"x y", b"x:y", b""]
    values = [b"a", b"a b", b" a", b"a ", b"\ta", b"x=1; Path=/", b'sid="q w"; HttpOnly', b"1", b"07"]
    values += [b"close", b"keep-alive", b"chunked", b"\x7f", b"\xff", b"a\x00b", b"", b"a:b", b"~"]
    read = 0
    for _ in range(4000):
        body = rng.choice([b"", b"{}", b"x" * rng.randrange(0, 40)])
        lines = [
            rng.choice(names) + rng.choice([b": ", b":", b" : "]) + rng.choice(values)
            for _ in range(rng.randrange(0, 5))
        ]
        if rng.random() < 0.8:
            lines.insert(rng.randrange(len(lines) + 1), b"Content-Length: %d" % len(body))
        status = rng.choice([b"200 OK", b"201 Created", b"204 No Content", b"404 ", b"503 Busy", b"099 x"])
        data = b"HTTP/1.1 " + status + b"\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n" + body
        read += _check(data)
        assert (hop_client.parse_whole_answer(data) is not None) == _plainly_whole(data), data
    assert read > 300  # the comparison covered many answers read in one go


REAL_SET_COOKIES = [
    "session_id=abc123; HttpOnly; Path=/; SameSite=strict",
    'session_id="abc 123"; HttpOnly',
    'q="\\"quoted\\" \\073 semi"; Path=/',
    "a=1; b=2",
    "theme=light; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Max-Age=3600; Domain=example.com; Secure",
    "__Host-id=1; Secure; Path=/",
    "empty=; Path=/",
    "bad name=1",
    "=novalue",
    "x=1; Unknown=2",
    "id=a%20b; Partitioned",
    "nobody",
]


async def test_cookies_of_an_answer_read_in_one_go_are_those_of_the_parser() -> None:
    for value in REAL_SET_COOKIES:
        data = b"HTTP/1.1 200 OK\r\nSet-Cookie: %s\r\nContent-Length: 0\r\n\r\n" % value.encode()
        answer = hop_client.parse_whole_answer(data)
        assert answer is not None
        assert answer.cookies == _cookies_of(answer.raw_headers)
        slow = hop_client.HopResponse(200, answer.raw_headers, b"")
        assert slow.cookies == answer.cookies


async def _serve(writes: list[list[bytes]]) -> tuple[asyncio.AbstractServer, int]:
    """A loopback server writing ``writes[n]`` (pieces, a pause between them) for request n."""
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        try:
            while served < len(writes):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                pieces = writes[served]
                served += 1
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_whole_and_split_answers_on_one_reused_connection() -> None:
    split = [OURS[:20], OURS[20:60], OURS[60:]]
    chunked = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", b"3\r\nabc\r\n", b"0\r\n\r\n"]
    cookie = b"HTTP/1.1 200 OK\r\nSet-Cookie: sid=r1; Path=/\r\nContent-Length: 2\r\n\r\nhi"
    server, port = await _serve([[OURS], split, [OURS], chunked, [cookie], [OURS]])
    pool = hop_client.HopPool(4)
    try:
        bodies = []
        for _ in range(6):
            answer = await hop_client.request(
                pool, "POST", "127.0.0.1", port, "/x", b"", b"{}", deadline=pool.loop.time() + 5
            )
            bodies.append((answer.status, answer.body, answer.cookies))
        assert bodies == [
            (200, b'{"ok":true}', {}),
            (200, b'{"ok":true}', {}),
            (200, b'{"ok":true}', {}),
            (200, b"abc", {}),
            (200, b"hi", {"sid": "r1"}),
            (200, b'{"ok":true}', {}),
        ]
        assert pool.open_connections == 1  # all six on one kept connection
    finally:
        pool.close()
        server.close()


async def test_an_answer_that_closes_its_connection_is_not_pooled() -> None:
    closing = OURS.replace(b"content-type", b"connection: close\r\ncontent-type")
    server, port = await _serve([[closing], [OURS]])
    pool = hop_client.HopPool(4)
    try:
        answer = await hop_client.request(
            pool, "POST", "127.0.0.1", port, "/x", b"", b"{}", deadline=pool.loop.time() + 5
        )
        assert answer.body == b'{"ok":true}'
        assert pool.open_connections == 0
    finally:
        pool.close()
        server.close()


def test_the_same_request_bytes_with_a_remembered_head() -> None:
    head = hop_client.request_head("POST", "h", 1, "/a b", b"X: y\r\n")
    assert hop_client.build_request("POST", "h", 1, "/a b", b"X: y\r\n", b"{}") == (
        b"POST /a%20b HTTP/1.1\r\nHost: h:1\r\nX: y\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert hop_client.build_request("POST", "h", 1, "/a b", b"X: y\r\n", b"{}", head) == (
        b"POST /a%20b HTTP/1.1\r\nHost: h:1\r\nX: y\r\nContent-Length: 2\r\n\r\n{}"
    )
    big = b"x" * 70000
    assert hop_client.build_request("GET", "h", 1, "/", b"", big) == [
        b"GET / HTTP/1.1\r\nHost: h:1\r\nContent-Length: 70000\r\n\r\n",
        big,
    ]
