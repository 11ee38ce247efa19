"""[VIEWER] the viewer in a real browser: headless Chromium driven over its DevTools protocol.

Debian's ``chromium`` (``scripts/test.sh`` installs it when it can) runs headless with remote
debugging; the test speaks the DevTools protocol to it over a websocket (aiohttp's client).
The collection comes from the README's main job (CPU engine, tiny model, forced completions:
a tool call then an answer, so rewards are 1 and each rollout has two model calls); a copy with
edited rewards is the second collection, for Compare. ``ng_viewer`` runs as a real process with
``NEMO_GYM_AUTH_TOKEN`` set, and the browser opens the URL it prints.

Each page loads and shows the numbers the files hold; the Tasks filters, the collection picker
and Compare's filter are used through the page itself. Screenshots of every page are saved under
``$NEMO_GYM_TEST_ARTIFACTS/viewer`` (default ``test-artifacts/viewer``).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from nemo_gym.launch.config import project_root

pytestmark = pytest.mark.slow

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)
if CHROMIUM is None:
    pytest.skip(
        "no Chromium: install Debian's chromium package (apt-get install chromium; scripts/test.sh "
        "does this when run as root) to run the viewer's browser tests",
        allow_module_level=True,
    )

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "Cold in Oslo: bring a jacket.",
]
TOKEN = "browser-test-token"
ARTIFACTS = Path(os.environ.get("NEMO_GYM_TEST_ARTIFACTS") or project_root() / "test-artifacts") / "viewer"


class DevTools:
    """A minimal DevTools-protocol client for one page target, over a websocket."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ws_url: str) -> None:
        self.loop = loop
        self.ids = itertools.count(1)
        self.http = loop.run_until_complete(self._session())
        self.ws = loop.run_until_complete(self.http.ws_connect(ws_url, max_msg_size=0))

    async def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        call_id = next(self.ids)
        await self.ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = await asyncio.wait_for(self.ws.receive(), timeout=30)
            if message.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"DevTools websocket closed: {message}")
            body = json.loads(message.data)
            if body.get("id") == call_id:
                if "error" in body:
                    raise RuntimeError(f"{method}: {body['error']}")
                return body.get("result", {})

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.loop.run_until_complete(self._call(method, params))

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def run(self, statements: str) -> None:
        """Run statements in a block of their own (their ``const`` names do not outlive it)."""
        self.eval("{ " + statements + " }")

    def wait(self, expression: str, timeout_s: float = 20.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                error = self.eval("document.getElementById('page-error')?.textContent || ''")
                raise AssertionError(f"timed out waiting for {expression!r} (page error: {error!r})")
            time.sleep(0.05)

    def goto(self, hash_route: str) -> None:
        """Go to ``#/<route>`` and wait until that page has rendered."""
        page = hash_route.split("?")[0]
        target = json.dumps("#/" + hash_route)
        # The same hash fires no hashchange: render again by hand (render is the page's router).
        self.eval(
            f"document.body.dataset.loaded = ''; if (location.hash === {target}) render(); "
            f"else location.hash = {target}; 1"
        )
        self.wait(f"document.body.dataset.loaded === {json.dumps(page)}")

    def text(self, selector: str) -> str:
        return self.eval(f"document.querySelector({json.dumps(selector)})?.textContent?.trim() ?? null")

    def count(self, selector: str) -> int:
        return self.eval(f"document.querySelectorAll({json.dumps(selector)}).length")

    def screenshot(self, name: str) -> Path:
        height = self.eval("Math.min(Math.max(document.documentElement.scrollHeight, 700), 2400)")
        self.call(
            "Emulation.setDeviceMetricsOverride", width=1400, height=height, deviceScaleFactor=1, mobile=False
        )
        data = self.call("Page.captureScreenshot", format="png")["data"]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        path.write_bytes(base64.b64decode(data))
        self.call(
            "Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False
        )
        return path

    def close(self) -> None:
        self.loop.run_until_complete(self.ws.close())
        self.loop.run_until_complete(self.http.close())


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The main job's collection (A) and an edited copy (B) in ng_viewer, behind an auth token."""
    root = tmp_path_factory.mktemp("viewer_browser")
    a = root / "a" / "rollouts.jsonl"
    a.parent.mkdir()
    forced = root / "forced.yaml"
    engine = {"forced_completions": FORCED, "default_max_tokens": 48}
    forced.write_text(
        yaml.safe_dump({"local_hf_engine": {"responses_api_models": {"local_hf_model": engine}}})
    )
    job = subprocess.run(
        [sys.executable, "-m", "nemo_gym.tools.main_job", f"+output_jsonl_fpath={a}", "+num_repeats=2",
         f"+config_paths=[{forced}]"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    command = re.search(
        r"See the rollouts in the viewer: ng_viewer \+input=\S+ \+tokenizer=(\S+)", job.stdout
    )
    assert command, job.stdout[-2000:]
    rows = read_rows(a)
    b = root / "b" / "rollouts.jsonl"
    b.parent.mkdir()
    edited = [dict(row) for row in rows]
    for row in edited:  # task 0 never solved, task 1 solved once: B loses task 0
        if row["_ng_task_index"] == 0 or (row["_ng_task_index"] == 1 and row["_ng_rollout_index"] == 0):
            row["reward"] = 0.0
    b.write_text("".join(json.dumps(row) + "\n" for row in edited))
    # C: a collection still running: 4 of its rows so far, and one rollout that failed.
    live = root / "live" / "rollouts.jsonl"
    live.parent.mkdir()
    shutil.copy(
        a.with_name("rollouts_materialized_inputs.jsonl"),
        live.with_name("rollouts_materialized_inputs.jsonl"),
    )
    failed = next(row for row in rows if (row["_ng_task_index"], row["_ng_rollout_index"]) == (4, 1))
    record = {**failed, "_ng_failure_class": "agent_timeout", "_ng_error": "agent did not answer in 30 s"}
    live.with_name("rollouts_failures.jsonl").write_text(json.dumps(record) + "\n")
    pending = [json.dumps(row) + "\n" for row in rows if row is not failed]
    live.write_text("".join(pending[:4]))
    viewer = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.viewer.app", f"+input={a},{b},{live}", f"+tokenizer={command.group(1)}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "NEMO_GYM_AUTH_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        assert viewer.stdout is not None
        url = None
        for line in viewer.stdout:
            found = re.search(r"Viewer: (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "ng_viewer did not print its URL"
        yield {"url": url, "a": rows, "b": edited, "live": live, "live_rest": pending[4:]}
    finally:
        viewer.terminate()
        viewer.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(served: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    """Headless Chromium on the printed URL (which carries the token), driven over DevTools."""
    profile = tmp_path_factory.mktemp("chromium_profile")
    process = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         "--window-size=1400,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    tools = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            assert process.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port in 60 s"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])

        async def page_ws() -> str:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                    targets = await response.json()
            return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")

        tools = DevTools(loop, loop.run_until_complete(page_ws()))
        tools.call("Page.enable")
        tools.call(
            "Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False
        )
        tools.call("Page.navigate", url=served["url"])
        tools.wait("document.body && document.body.dataset.loaded === 'overview'", timeout_s=30)
        yield tools
    finally:
        if tools is not None:
            tools.close()
        loop.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def test_token_url_opens_the_overview(browser: DevTools, served: dict[str, Any]) -> None:
    # The ?token= URL was answered with a cookie and a redirect to the bare page.
    assert browser.eval("location.search") == ""
    assert browser.eval("fetch('/api/collections').then(r => r.status)") == 200


def test_overview_page(browser: DevTools, served: dict[str, Any]) -> None:
    rows = served["a"]
    browser.goto("overview?c=0")
    assert browser.text("#stat-rollouts") == str(len(rows)) == "10"
    assert browser.text("#stat-tasks") == "5"
    assert browser.text("#stat-failures") == "0"
    assert browser.text("#stat-mean-reward") == "1"
    assert browser.text("#stat-pass1") == "100.0%"
    # The metrics file keeps pass@k in percent and means as fractions: the page gives the unit.
    metrics_file = browser.text("#metrics-file")
    assert "mean/reward = 1" in metrics_file and "/reward = 100.0%" in metrics_file
    assert "= 100<" not in browser.eval("document.getElementById('metrics-file').innerHTML")
    assert browser.text("#stat-token-rows") == "10"
    assert browser.count("#plot-rewards svg rect.bar") == 1
    assert browser.count("#plot-pass-at-k svg circle.point") == 2
    assert browser.count("#agents tr.agent-row") == 1
    assert browser.text("#progress").startswith("10 / 10 rollouts")
    browser.screenshot("overview")
    # The collection picker switches to B: 7 of 10 rollouts solved, pass@1 70 %.
    browser.run(
        "const p = document.getElementById('collection-picker'); p.value = '1'; p.dispatchEvent(new Event('change')); 1"
    )
    browser.wait("location.hash.includes('c=1') && document.body.dataset.loaded === 'overview'")
    browser.wait("document.getElementById('stat-mean-reward')?.textContent === '0.700'")
    assert browser.text("#stat-pass1") == "70.0%"
    assert browser.count("#plot-rewards svg rect.bar") == 2  # rewards 0 and 1
    browser.screenshot("overview_b")


def test_tasks_page_and_filters(browser: DevTools) -> None:
    browser.goto("tasks?c=1")
    assert browser.text("#tasks-total") == "5"
    assert browser.count("#tasks tr.task-row") == 5
    assert browser.count("#tasks tr.task-row[data-task='0'] a.chip.bad") == 2
    browser.screenshot("tasks")
    # Status filter through its select.
    browser.run(
        "const s = document.querySelector('#task-filters select[name=status]'); s.value = 'never';"
        " s.dispatchEvent(new Event('change')); 1"
    )
    browser.wait("location.hash.includes('status=never') && document.body.dataset.loaded === 'tasks'")
    assert browser.text("#tasks-total") == "1"
    assert browser.eval("[...document.querySelectorAll('#tasks tr.task-row')].map(r => r.dataset.task)") == [
        "0"
    ]
    # Prompt search and a reward range, typed into the form and submitted.
    browser.goto("tasks?c=1")
    browser.run(
        "const f = document.getElementById('task-filters'); f.q.value = 'lisbon'; f.min.value = '0.4';"
        " f.requestSubmit(); 1"
    )
    browser.wait("location.hash.includes('q=lisbon') && document.body.dataset.loaded === 'tasks'")
    assert browser.text("#tasks-total") == "1"
    assert browser.eval("document.querySelector('#tasks tr.task-row').dataset.task") == "1"
    assert "Lisbon" in browser.text("#tasks tr.task-row .prompt")
    browser.goto("tasks?c=1&min=0.6")
    assert browser.text("#tasks-total") == "3"


def test_rollout_page_shows_the_conversation_and_repeats(browser: DevTools, served: dict[str, Any]) -> None:
    browser.goto("tasks?c=0")
    # Open task 1's first repeat by clicking its reward chip.
    browser.eval("document.querySelector(\"#tasks tr.task-row[data-task='1'] a.chip\").click(); 1")
    browser.wait("document.body.dataset.loaded === 'rollout'")
    row = int(browser.eval("new URLSearchParams(location.hash.split('?')[1]).get('row')"))
    data = served["a"][row]
    assert data["_ng_task_index"] == 1
    assert browser.count(".repeats .convo") == 2  # the task's two repeats side by side
    first = ".repeats .convo:first-child"
    assert browser.text(f"{first} .item.user pre") == data["responses_create_params"]["input"][-1]["content"]
    assert "get_weather" in browser.text(f"{first} .item.function_call .role")
    assert '"city": "Oslo"' in browser.text(f"{first} .item.function_call pre")
    output = next(i for i in data["response"]["output"] if i["type"] == "function_call_output")
    assert json.loads(browser.text(f"{first} .item.function_call_output pre")) == json.loads(output["output"])
    assert browser.text(f"{first} .item.assistant pre") == "Cold in Oslo: bring a jacket."
    assert browser.text(f"{first} .verify-reward") == "1"
    assert "called_tool" in browser.text(f"{first} .item.verify")
    browser.screenshot("rollout")
    if row + 1 < len(served["a"]):
        browser.eval("document.getElementById('next-row').click(); 1")
        browser.wait(f"location.hash.endsWith('row={row + 1}') && document.body.dataset.loaded === 'rollout'")
        assert browser.eval("document.querySelector('.repeats .convo').dataset.row") == str(row + 1)


def test_tokens_page(browser: DevTools, served: dict[str, Any]) -> None:
    browser.goto("tokens?c=0&row=0")
    api = browser.eval("fetch('/api/tokens?c=0&row=0').then(r => r.json())")
    assert browser.text("#verdict").startswith("Contiguous: all 2 model calls")
    assert browser.text("#tok-length") == str(api["length"]) == str(browser.count("#tokens span.tok"))
    assert (
        browser.text("#tok-trained")
        == str(api["trained_tokens"])
        == str(browser.count("#tokens span.tok.m1"))
    )
    assert browser.count("#tokens span.tok.callstart") == 2
    prompt = served["a"][0]["responses_create_params"]["input"][-1]["content"]
    assert prompt in browser.eval("document.getElementById('tokens').textContent")
    trained_title = browser.eval("document.querySelector('#tokens span.tok.m1').title")
    assert "trained · logprob -" in trained_title
    assert "not trained" in browser.eval("document.querySelector('#tokens span.tok.m0').title")
    browser.screenshot("tokens")


def test_compare_page(browser: DevTools) -> None:
    browser.goto("compare?a=0&b=1")
    assert browser.text("#cmp-common") == "5"
    assert (browser.text("#cmp-gained"), browser.text("#cmp-lost")) == ("0", "1")
    assert (browser.text("#cmp-mean-a"), browser.text("#cmp-mean-b")) == ("1", "0.700")
    order = browser.eval("[...document.querySelectorAll('#compare tr.compare-row')].map(r => r.dataset.task)")
    assert order[:2] == ["0", "1"] and len(order) == 5
    assert browser.text("#compare tr.compare-row[data-task='0'] .badge") == "lost"
    browser.screenshot("compare")
    browser.run(
        "const s = document.querySelector('#compare-form select[name=show]'); s.value = 'flipped';"
        " s.dispatchEvent(new Event('change')); 1"
    )
    browser.wait("location.hash.includes('show=flipped') && document.body.dataset.loaded === 'compare'")
    assert browser.text("#compare-total") == "1"
    assert browser.eval(
        "[...document.querySelectorAll('#compare tr.compare-row')].map(r => r.dataset.task)"
    ) == ["0"]


def test_bad_route_parameters_show_the_error(browser: DevTools) -> None:
    browser.eval("location.hash = '#/rollout?c=0&row=999'; 1")
    browser.wait("document.body.dataset.loaded === 'error'")
    assert "no row 999" in browser.text("#page-error")


def test_running_collection_shows_progress_live(browser: DevTools, served: dict[str, Any]) -> None:
    browser.goto("overview?c=2")
    assert browser.text("#stat-rollouts") == "4"
    assert browser.text("#stat-failures") == "1"
    assert browser.text("#progress") == "4 / 10 rollouts, 1 failed — collecting"
    assert browser.text("#failure-samples tr.failure-row td:nth-child(3)") == "agent_timeout"
    assert "did not answer" in browser.text("#failure-samples tr.failure-row")
    browser.screenshot("overview_live")
    with served["live"].open("a") as sink:  # the collection goes on; nobody reloads the page
        sink.write("".join(served["live_rest"]))
    browser.wait("document.getElementById('stat-rollouts')?.textContent === '9'", timeout_s=15)
    browser.wait("document.getElementById('progress').textContent === '9 / 10 rollouts, 1 failed'")
