"""CPU per call of ``nemo_gym.responses_converter.ResponsesConverter``, here and under NeMo Gym.

NeMo Gym's model adapters (``vllm_model``, ``azure_openai_model``, ...) call the converter twice per
model call: ``responses_to_chat_completion_create_params`` on the rollout so far and
``chat_completion_to_response`` on the engine's answer. The workload is an RL rollout with token
IDs: ``--turns`` tool-calling turns, each a reasoning item and a function call carrying its call's
prompt and generated token IDs (the prompt growing by ``--tokens-per-turn``), and a tool output;
the answer is a ``<think>`` block, text and a tool call with its token IDs. The same workload code
runs in a child process under this package, and, given ``--nemo-gym-python`` (a Python with NeMo
Gym 0.7.0's dependencies) and ``--wheel-dir`` (the unpacked wheel), under NeMo Gym's own
``nemo_gym``. Printed: the median microseconds per call of each method.

    python scripts/bench_responses_converter.py --nemo-gym-python /path/to/venv/bin/python \\
        --wheel-dir ~/.cache/nemo_gym_corpus/nemo_gym-0.7.0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

WORKLOAD = r"""
import json, statistics, sys, time
from nemo_gym.openai_utils import NeMoGymChatCompletion, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import ResponsesConverter

turns, per_turn, iterations = (int(a) for a in sys.argv[1:4])
tool = {"type": "function", "name": "search", "description": "Search.", "strict": True,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}
items = [{"role": "user", "content": "Find the answer."}]
for turn in range(turns):
    prompt = list(range(per_turn * (turn + 1)))
    items.append({"type": "reasoning", "id": f"rs_{turn}", "summary": [{"type": "summary_text", "text": "Think " * 40}]})
    items.append({"type": "function_call", "id": f"call_{turn}", "call_id": f"call_{turn}", "name": "search",
                  "arguments": json.dumps({"q": f"query {turn}"}), "prompt_token_ids": prompt,
                  "generation_token_ids": list(range(120)), "generation_log_probs": [-0.5] * 120})
    items.append({"type": "function_call_output", "call_id": f"call_{turn}", "output": "result " * 60})
params = NeMoGymResponseCreateParamsNonStreaming(input=items, tools=[tool], model="policy", temperature=1.0)
message = {"role": "assistant", "content": "<think>" + "reason " * 80 + "</think>Calling search.",
           "tool_calls": [{"id": "call_x", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}],
           "prompt_token_ids": list(range(per_turn * (turns + 1))), "generation_token_ids": list(range(200)),
           "generation_log_probs": [-0.25] * 200}
completion = NeMoGymChatCompletion.model_validate({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
    "model": "policy", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": message}],
    "usage": {"prompt_tokens": per_turn * (turns + 1), "completion_tokens": 200, "total_tokens": per_turn * (turns + 1) + 200}})
converter = ResponsesConverter(return_token_id_information=True)

def median_us(call):
    for _ in range(max(3, iterations // 10)):
        call()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 1)

chat = converter.responses_to_chat_completion_create_params(params)
assert sum(1 for m in chat.messages if m["role"] == "tool") == turns
print(json.dumps({
    "responses_to_chat_completion_create_params": median_us(lambda: converter.responses_to_chat_completion_create_params(params)),
    "chat_completion_to_response": median_us(lambda: converter.chat_completion_to_response(params, completion)),
}))
"""


def run(python: str, pythonpath: str, args: argparse.Namespace) -> dict[str, float]:
    """The workload's numbers under ``python`` with ``pythonpath`` first on the path."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    argv = [python, "-c", WORKLOAD, str(args.turns), str(args.tokens_per_turn), str(args.iterations)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=600, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the workload here (and under NeMo Gym when given) and print a table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens-per-turn", type=int, default=800)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--nemo-gym-python", help="a Python with NeMo Gym 0.7.0's dependencies")
    parser.add_argument("--wheel-dir", type=Path, help="the unpacked nemo-gym wheel")
    args = parser.parse_args()

    rows = [("this package", run(sys.executable, str(Path(__file__).resolve().parents[1]), args))]
    if args.nemo_gym_python and args.wheel_dir:
        rows.append(("NeMo Gym 0.7.0", run(args.nemo_gym_python, str(args.wheel_dir.resolve()), args)))
    print(f"{args.turns} turns, prompt +{args.tokens_per_turn} token IDs a turn; median us per call")
    print(f"{'converter':<16} {'responses->chat':>16} {'chat->response':>15}")
    for name, numbers in rows:
        print(
            f"{name:<16} {numbers['responses_to_chat_completion_create_params']:>16} "
            f"{numbers['chat_completion_to_response']:>15}"
        )


if __name__ == "__main__":
    main()
