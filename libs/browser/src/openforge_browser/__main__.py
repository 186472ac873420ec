"""``openforge-browser``: one browser episode through a model endpoint.

``--api`` picks the wire API: ``chat`` (OpenAI Chat Completions, the default), ``messages``
(Anthropic Messages) or ``responses`` (OpenAI Responses). The endpoint comes from the flags or, as
the SDKs read them, ``OPENAI_BASE_URL`` (with ``/v1``) and ``OPENAI_API_KEY`` for the OpenAI APIs,
``ANTHROPIC_BASE_URL`` (without ``/v1``) and ``ANTHROPIC_API_KEY`` for Messages; the model from
``--model`` or ``OPENFORGE_MODEL``. The episode
record (answer, actions, final page state) is written as JSON to ``--out`` for the verifier.
Exit status 0 when the episode ran (whatever the answer), 2 on bad usage, 1 when the model could
not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from openforge_browser.agent import APIS, ChatEndpoint, ChatError, run


def _endpoint_env(api: str) -> tuple[str, str]:
    """The base URL (with ``/v1``) and key the API's SDK would read from the environment."""
    if api == "messages":
        base = os.environ.get("ANTHROPIC_BASE_URL", "")
        return (base.rstrip("/") + "/v1" if base else ""), os.environ.get("ANTHROPIC_API_KEY", "")
    return os.environ.get("OPENAI_BASE_URL", ""), os.environ.get("OPENAI_API_KEY", "")


def main(argv: list[str] | None = None) -> int:
    """Parses the flags, runs one episode, writes its record."""
    p = argparse.ArgumentParser(prog="openforge-browser", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="Start page (file:// or http://).")
    task = p.add_mutually_exclusive_group(required=True)
    task.add_argument("--instruction", help="The task's instruction.")
    task.add_argument("--instruction-file", type=Path, help="A file holding the instruction.")
    p.add_argument("--api", choices=APIS, default="chat", help="Wire API (default: chat).")
    p.add_argument("--base-url", help="Endpoint base, with /v1 (default: from the API's environment).")
    p.add_argument("--api-key", help="The key (default: from the API's environment).")
    p.add_argument("--model", default=os.environ.get("OPENFORGE_MODEL", ""), help="Model name to send.")
    p.add_argument("--max-steps", type=int, default=10, help="Most model calls in the episode.")
    p.add_argument("--out", type=Path, required=True, help="Where to write the episode record (JSON).")
    args = p.parse_args(argv)
    env_base, env_key = _endpoint_env(args.api)
    base_url = args.base_url or env_base
    api_key = args.api_key if args.api_key is not None else env_key
    if not base_url or not args.model:
        p.error(
            "--base-url (or OPENAI_BASE_URL; ANTHROPIC_BASE_URL with --api messages) and --model "
            "(or OPENFORGE_MODEL) are required"
        )
    instruction = args.instruction if args.instruction is not None else args.instruction_file.read_text().strip()
    endpoint = ChatEndpoint(base_url=base_url, api_key=api_key, model=args.model, api=args.api)
    try:
        episode = asyncio.run(run(args.url, instruction, endpoint, args.max_steps))
    except ChatError as exc:
        sys.stderr.write(f"openforge-browser: {exc}\n")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(episode.to_json(), indent=1))
    sys.stdout.write(f"openforge-browser: {episode.calls} calls, finished={episode.finished}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
