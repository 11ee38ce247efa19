"""The viewer shows images from rollouts safely: data: URLs of raster types inline, nothing else loaded.

The page's own rendering code (``renderContent`` in ``static/app.js``) runs under Node on hostile
parts (a remote URL, an SVG, ``javascript:``, markup in URLs and text); the page is served with a
Content-Security-Policy that allows images from data: URLs only and scripts from the page's origin.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from nemo_gym.testing import running_app, write_jsonl
from nemo_gym.viewer.app import Viewer, build_app
from nemo_gym.viewer.collection import Collection

APP_JS = Path(__file__).resolve().parents[1] / "nemo_gym" / "viewer" / "static" / "app.js"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def render(parts: list[object]) -> str:
    """``renderContent(parts)`` of the viewer's own app.js, run by Node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node: the viewer's rendering code is checked with Node (apt-get install nodejs)")
    source = APP_JS.read_text()
    start = source.index("function esc(")
    helpers = source[start : source.index("function fmt(", start)]
    media = source[source.index("function textOf(") : source.index("function prettyJson(")]
    script = helpers + media + f"\nprocess.stdout.write(renderContent({json.dumps(parts)}));\n"
    done = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_images_render_inline_only_from_data_urls() -> None:
    html = render(
        [
            {"type": "input_text", "text": "<b>look</b>"},
            {"type": "input_image", "image_url": PNG},
            {"type": "image_url", "image_url": {"url": PNG}},
            {"type": "input_image", "image_url": "https://attacker.example/pixel.png"},
            {"type": "input_image", "image_url": "data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+"},
            {"type": "input_image", "image_url": 'javascript:alert(1)"><script>alert(2)</script>'},
            {"type": "input_image", "image_url": 'data:image/png;base64,AAAA" onerror="alert(3)'},
            {"type": "input_video", "video_url": "file:///data/clip.mp4"},
            {"type": "input_file", "filename": "<img src=x onerror=alert(4)>.pdf", "file_data": "data:..."},
        ]
    )
    assert html.count("<img ") == 2 and html.count(f'src="{PNG}"') == 2
    assert "attacker.example" in html and 'src="https' not in html  # named, never loaded
    assert "svg" in html and 'src="data:image/svg' not in html
    tags = re.findall(r"<[^>]*>", html)
    assert {re.match(r"</?(\w+)", tag).group(1) for tag in tags} == {"pre", "img", "div"}  # type: ignore[union-attr]
    assert not [tag for tag in tags if "onerror" in tag or "javascript:" in tag or "script" in tag]
    assert "&lt;img src=x onerror=alert(4)&gt;" in html and "&lt;b&gt;look&lt;/b&gt;" in html
    assert "[video: file:///data/clip.mp4]" in html
    assert render([{"type": "input_text", "text": "plain"}]) == "<pre>plain</pre>"


def test_page_is_served_with_a_policy_that_blocks_remote_images(tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "r.jsonl", [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}])
    with running_app(build_app(Viewer([Collection.open(rows)]), token="")) as url:
        with urllib.request.urlopen(url + "/", timeout=10) as answer:
            policy = answer.headers["Content-Security-Policy"]
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["img-src"] == "'self' data:" and directives["script-src"] == "'self'"
    assert directives["default-src"] == "'self'" and directives["object-src"] == "'none'"
