"""Owns the client commands ``tokenferry chat`` (interactive, streaming) and ``tokenferry complete``.

They talk to any OpenAI-compatible server through the official ``openai`` SDK;
tokenferry's extra parameters (``ignore_eos``) travel in ``extra_body``.

An empty key (``--api-key ""``, ``TOKENFERRY_API_KEY=``) means no key, as it does
for the gateway's settings. The SDK refuses an empty key ("Missing credentials")
and cannot be told to send no ``Authorization`` header, so ``NO_KEY`` goes instead:
a gateway without keys ignores it, one with keys answers 401.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, cast

from openai import OpenAI, OpenAIError, Stream
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from shared.settings import ClientSettings


def add_client_commands(commands: Any) -> None:
    chat = commands.add_parser("chat", help="interactive streaming chat", argument_default=argparse.SUPPRESS)
    chat.add_argument("--system", help="system prompt")
    _add_generation_flags(chat)
    chat.set_defaults(handler=run_chat)
    complete = commands.add_parser("complete", help="complete one prompt", argument_default=argparse.SUPPRESS)
    complete.add_argument("prompt")
    complete.add_argument("--no-stream", dest="stream", action="store_false", default=True)
    _add_generation_flags(complete)
    complete.set_defaults(handler=run_complete)


def _add_generation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", help="default http://127.0.0.1:8000/v1 (TOKENFERRY_BASE_URL)")
    parser.add_argument("--api-key", help="Bearer key (TOKENFERRY_API_KEY)")
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--show-usage", action="store_true", help="print token usage after each answer")


NO_KEY = "not-needed"  # what the SDK sends when no key is given (it refuses an empty one)


def sdk_client(settings: ClientSettings) -> OpenAI:
    """The official SDK's client for ``settings``; an empty key means no key."""
    return OpenAI(base_url=settings.base_url, api_key=settings.api_key or NO_KEY)


def _connect(args: argparse.Namespace) -> tuple[OpenAI, str]:
    values = {name: getattr(args, name) for name in ("base_url", "api_key", "model") if hasattr(args, name)}
    settings = ClientSettings(**values)
    client = sdk_client(settings)
    if settings.model:
        return client, settings.model
    served = client.models.list().data
    if not served:
        raise OpenAIError(f"{settings.base_url} serves no model yet; wait for its worker, or pass --model")
    return client, served[0].id


def _request_options(args: argparse.Namespace) -> dict[str, Any]:
    request: dict[str, Any] = {
        name: getattr(args, name) for name in ("max_tokens", "temperature", "seed") if hasattr(args, name)
    }
    if getattr(args, "ignore_eos", False):
        request["extra_body"] = {"ignore_eos": True}
    if getattr(args, "show_usage", False):
        request["stream_options"] = {"include_usage": True}
    return request


def _print_usage(usage: Any) -> None:
    print(
        f"[usage: {usage.prompt_tokens} prompt + {usage.completion_tokens} completion "
        f"= {usage.total_tokens} tokens]",
        file=sys.stderr,
    )


def run_complete(args: argparse.Namespace) -> int:
    try:
        client, model = _connect(args)
        stream: Stream[Completion] = client.completions.create(
            model=model, prompt=args.prompt, stream=True, **_request_options(args)
        )
        for chunk in stream:
            if chunk.choices:
                print(chunk.choices[0].text, end="", flush=True)
            if chunk.usage is not None:
                print()
                _print_usage(chunk.usage)
        print()
    except OpenAIError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def run_chat(args: argparse.Namespace) -> int:
    try:
        client, model = _connect(args)
    except OpenAIError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    messages: list[dict[str, str]] = (
        [{"role": "system", "content": args.system}] if hasattr(args, "system") else []
    )
    print(f"chatting with {model}; Ctrl-D or /exit quits, /reset forgets the conversation", file=sys.stderr)
    while (line := _read_line()) is not None:
        if line.strip() in ("/exit", "/quit"):
            break
        if line.strip() == "/reset":
            del messages[int(bool(messages) and messages[0]["role"] == "system") :]
            continue
        messages.append({"role": "user", "content": line})
        answer = _stream_answer(client, model, messages, args)
        messages.append({"role": "assistant", "content": answer})
    return 0


def _read_line() -> str | None:
    try:
        return input("> ")
    except (EOFError, KeyboardInterrupt):
        print()
        return None


def _stream_answer(
    client: OpenAI, model: str, messages: list[dict[str, str]], args: argparse.Namespace
) -> str:
    parts: list[str] = []
    try:
        stream: Stream[ChatCompletionChunk] = client.chat.completions.create(
            model=model, messages=cast(Any, messages), stream=True, **_request_options(args)
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                print(chunk.choices[0].delta.content, end="", flush=True)
            if chunk.usage is not None:
                print()
                _print_usage(chunk.usage)
    except OpenAIError as error:
        print(f"\nerror: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
    print()
    return "".join(parts)
