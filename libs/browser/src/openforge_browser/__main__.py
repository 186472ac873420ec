"""``openforge-browser``: one browser episode through an OpenAI-compatible endpoint.

The endpoint comes from the flags or, as the OpenAI SDK reads them, ``OPENAI_BASE_URL`` (with
``/v1``) and ``OPENAI_API_KEY``; the model from ``--model`` or ``OPENFORGE_MODEL``. The episode
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

from openforge_browser.agent import ChatEndpoint, ChatError, run


def main(argv: list[str] | None = None) -> int:
    """Parses the flags, runs one episode, writes its record."""
    p = argparse.ArgumentParser(prog="openforge-browser", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="Start page (file:// or http://).")
    task = p.add_mutually_exclusive_group(required=True)
    task.add_argument("--instruction", help="The task's instruction.")
    task.add_argument("--instruction-file", type=Path, help="A file holding the instruction.")
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", ""), help="Endpoint base, with /v1.")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""), help="Bearer key.")
    p.add_argument("--model", default=os.environ.get("OPENFORGE_MODEL", ""), help="Model name to send.")
    p.add_argument("--max-steps", type=int, default=10, help="Most model calls in the episode.")
    p.add_argument("--out", type=Path, required=True, help="Where to write the episode record (JSON).")
    args = p.parse_args(argv)
    if not args.base_url or not args.model:
        p.error("--base-url (or OPENAI_BASE_URL) and --model (or OPENFORGE_MODEL) are required")
    instruction = args.instruction if args.instruction is not None else args.instruction_file.read_text().strip()
    endpoint = ChatEndpoint(base_url=args.base_url, api_key=args.api_key, model=args.model)
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
