"""vLLM's scale-out API against what pdspec's proxy uses today, on one real worker.

    python -m loadtest.micro.scale_out_api --out loadtest/results/scale_out_api/cpu

vLLM 0.32+ serves, with `--enable-scale-out`, `/v1/chat/completions/render` (a chat
rendered into token ids and sampling parameters) and `/inference/v1/generate` (token ids
in, tokens out, `kv_transfer_params` accepted). A front end could render once, route on
the ids and send ids to both P/D legs. This measures what that would buy against pdspec's
`/tokenize` (token ids for cache-aware routing) and OpenAI `/v1/chat/completions` legs:
- the ids: `/tokenize` of a chat and `/render` of the same chat agree;
- latency of `/tokenize` and of `/render` for the same chats (median, p90);
- latency of a short greedy decode through `/v1/chat/completions` and through
  `/inference/v1/generate` with the rendered request, and whether their tokens agree;
- what each answer carries (the OpenAI chat shape, or tokens to be turned into one).
Starts `pdspec up --layout colocated` with `--enable-scale-out` and prefix caching off
(every chat goes down both paths); writes `scale_out.json`
and `scale_out.md` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from loadtest.serving.chaos import start as start_up

MODEL = "pdspec-tiny"
WORDS = ("value", "config", "path", "return", "def", "class", "self", "import", "loop", "key", "items", "list")


def chats(count: int, words: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    return [
        [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(words))},
        ]
        for _ in range(count)
    ]


def start(port: int, run_dir: Path) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "pdspec.cli",
        "up",
        "--layout",
        "colocated",
        "--colocated.port",
        str(port),
        # No prefix caching: each chat is sent on both paths, and the second would hit.
        "--colocated.extra_vllm_args",
        json.dumps(["--enable-scale-out", "--no-enable-prefix-caching"]),
        "--run_dir",
        str(run_dir),
    ]
    return start_up(argv, "pdspec up: ready:")


def timed(client: httpx.Client, url: str, body: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    response = client.post(url, json=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, f"{url}: {response.status_code} {response.text[:500]}"
    return elapsed, response.json()


def dist(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"median": round(float(np.median(ms)), 2), "p90": round(float(np.percentile(ms, 90)), 2)}


def measure(base: str, messages_list: list[list[dict]], max_tokens: int) -> dict:
    times: dict[str, list[float]] = {"tokenize": [], "render": [], "chat": [], "generate": []}
    same_ids = same_text = 0
    # One of each first: the first calls of a fresh server pay for warm-up.
    warm = {"model": MODEL, "messages": messages_list[0], "max_tokens": max_tokens, "temperature": 0}
    prompt_tokens: list[int] = []
    shapes: dict[str, list[str]] = {}
    with httpx.Client(timeout=120) as client:
        _, rendered = timed(client, base + "/v1/chat/completions/render", warm)
        timed(client, base + "/inference/v1/generate", rendered)
        timed(client, base + "/v1/chat/completions", warm)
        for messages in messages_list:
            t, tokenized = timed(
                client, base + "/tokenize", {"model": MODEL, "messages": messages, "add_generation_prompt": True}
            )
            times["tokenize"].append(t)
            chat = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
            t, rendered = timed(client, base + "/v1/chat/completions/render", chat)
            times["render"].append(t)
            same_ids += tokenized["tokens"] == rendered["token_ids"]
            prompt_tokens.append(len(rendered["token_ids"]))
            t, answer = timed(client, base + "/v1/chat/completions", {**chat, "return_token_ids": True})
            times["chat"].append(t)
            t, generated = timed(client, base + "/inference/v1/generate", rendered)
            times["generate"].append(t)
            # The same greedy tokens: /generate answers ids, the chat text and ids.
            same_text += generated["choices"][0]["token_ids"] == answer["choices"][0]["token_ids"]
            shapes = {
                "chat": sorted(answer),
                "generate": sorted(generated),
                "generate_choice": sorted(generated["choices"][0]),
            }
    return {
        "prompts": len(messages_list),
        "prompt_tokens_median": int(np.median(prompt_tokens)),
        "max_tokens": max_tokens,
        "ids_agree": same_ids,
        "outputs_agree": same_text,
        "ms": {name: dist(values) for name, values in times.items()},
        "answer_fields": shapes,
    }


def markdown(report: dict) -> str:
    ms = report["ms"]
    return "\n".join(
        [
            f"Command: `{report['command']}`",
            "",
            f"{report['prompts']} chats of about {report['prompt_tokens_median']} tokens, {report['max_tokens']} greedy "
            f"output tokens; prompt ids agree {report['ids_agree']}/{report['prompts']}, output tokens agree "
            f"{report['outputs_agree']}/{report['prompts']}.",
            "",
            "| call | median ms | p90 ms |",
            "| --- | --- | --- |",
            *(
                f"| {name} | {ms[name]['median']} | {ms[name]['p90']} |"
                for name in ("tokenize", "render", "chat", "generate")
            ),
            "",
            f"Fields of an answer: `/v1/chat/completions` {report['answer_fields']['chat']}; "
            f"`/inference/v1/generate` {report['answer_fields']['generate']}, a choice "
            f"{report['answer_fields']['generate_choice']}.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.micro.scale_out_api",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--words", type=int, default=1000, help="words in each chat's user message")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    process = start(args.port, Path(tempfile.mkdtemp(prefix="pdspec-scale-out-")))
    try:
        report = measure(f"http://127.0.0.1:{args.port}", chats(args.prompts, args.words, seed=0), args.max_tokens)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    report["command"] = "python -m loadtest.micro.scale_out_api " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale_out.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "scale_out.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
