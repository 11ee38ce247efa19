"""The direct routes' session cookie reader gives what starlette's ``cookie_parser`` gives."""

from __future__ import annotations

import random

from starlette.requests import cookie_parser

from nemo_gym.serving.direct_serve import session_cookie
from nemo_gym.serving.protocol import SESSION_COOKIE

PIECES = [SESSION_COOKIE, "session", "id", "=", ";", " ", "\t", '"', "\\", "abc", "0f3a", "é", ",", "other"]


def test_the_reader_matches_cookie_parser_on_hand_picked_headers() -> None:
    for header in [
        f"{SESSION_COOKIE}=0123456789abcdef0123456789abcdef",
        f" {SESSION_COOKIE} = abc ",
        f"{SESSION_COOKIE}=",
        f"{SESSION_COOKIE}",
        f'{SESSION_COOKIE}="quoted\\"value"',
        f'{SESSION_COOKIE}="',
        f"{SESSION_COOKIE}=a=b",
        f"other=1; {SESSION_COOKIE}=two",
        f"{SESSION_COOKIE}=one; {SESSION_COOKIE}=two",
        "other=1",
        "=abc",
        "",
    ]:
        raw = header.encode("latin-1", "replace")
        assert session_cookie(raw) == cookie_parser(raw.decode("latin-1")).get(SESSION_COOKIE), header


def test_the_reader_matches_cookie_parser_on_random_headers() -> None:
    rnd = random.Random(5)
    for _ in range(20_000):
        header = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 7))).encode("latin-1", "replace")
        assert session_cookie(header) == cookie_parser(header.decode("latin-1")).get(SESSION_COOKIE), header
