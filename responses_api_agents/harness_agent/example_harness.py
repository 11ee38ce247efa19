"""An example black-box harness: the ``openai`` client in a tool loop, knowing nothing of nemo_gym.

It reads the task (a dataset row) from ``NEMO_GYM_TASK_FILE``, talks to the model at
``OPENAI_BASE_URL`` and runs each tool call by POSTing its arguments to
``$NEMO_GYM_TOOLS_URL/<name>``, until the model answers without a tool call or ``--max-steps``
model calls. ``--api chat`` uses Chat Completions instead of the Responses API. It prints the
final answer. Any program doing the same in any language can take its place.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.request
from typing import Any

from openai import OpenAI


def run_tool(name: str, arguments: str) -> str:
    """One tool call through the tools URL; its output text."""
    request = urllib.request.Request(
        f"{os.environ['NEMO_GYM_TOOLS_URL']}/{name}",
        data=(arguments or "{}").encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        return answer.read().decode()


def responses_loop(client: OpenAI, params: dict[str, Any], max_steps: int) -> str:
    """The tool loop over the Responses API."""
    history: list[Any] = (
        params["input"]
        if isinstance(params["input"], list)
        else [{"role": "user", "content": params["input"]}]
    )
    tools = params.get("tools") or []
    for _ in range(max_steps):
        response = client.responses.create(model="policy", input=history, tools=tools)
        produced = [item.model_dump(exclude_none=True) for item in response.output]
        history = [*history, *produced]
        calls = [item for item in produced if item["type"] == "function_call"]
        if not calls:
            return response.output_text
        for call in calls:
            output = run_tool(call["name"], call["arguments"])
            history.append({"type": "function_call_output", "call_id": call["call_id"], "output": output})
    return ""


def chat_loop(client: OpenAI, params: dict[str, Any], max_steps: int) -> str:
    """The tool loop over Chat Completions."""
    raw = (
        params["input"]
        if isinstance(params["input"], list)
        else [{"role": "user", "content": params["input"]}]
    )
    messages: list[dict[str, Any]] = [{"role": m["role"], "content": m["content"]} for m in raw]
    tools = [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters") if k in t},
        }
        for t in params.get("tools") or []
    ]
    for _ in range(max_steps):
        completion = client.chat.completions.create(model="policy", messages=messages, tools=tools or None)  # type: ignore[arg-type]
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            function = getattr(call, "function", None)  # only function tools are offered
            output = run_tool(function.name, function.arguments) if function else "Error: not a function tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=("responses", "chat"), default="responses")
    parser.add_argument("--max-steps", type=int, default=10)
    args = parser.parse_args()
    with open(os.environ["NEMO_GYM_TASK_FILE"], encoding="utf-8") as handle:
        row = json.load(handle)
    client = OpenAI(max_retries=0, timeout=600)
    loop = chat_loop if args.api == "chat" else responses_loop
    print(loop(client, row["responses_create_params"], args.max_steps))


if __name__ == "__main__":
    main()
