"""Recorded harness requests (``shared/cases/harness-captures``) as test input.

The captures are what the real Claude Code, Codex, OpenClaw and mini-swe-agent
CLIs sent to a scripted capture server, and the answers they accepted (see the
folder's README). These helpers rebuild each request of a run and the answer
to script a fake engine with, so a run can be replayed through the proxy.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from openforge_testing.fakes import final_text, tool_call_text

#: The captures folder of a checkout: ``<repo>/../shared/cases/harness-captures``.
CAPTURES = Path(__file__).resolve().parents[5] / "shared" / "cases" / "harness-captures"
#: The one name :func:`run_names` gives when it finds no run; :func:`run_dir` fails on it.
NO_RUNS = "no-capture-runs"
REASONING = "**Planning** I will run a shell command."
_DROP_HEADERS = {"host", "content-length", "x-api-key", "authorization", "connection", "accept-encoding"}
#: The request fields the prompt is rendered from, in every protocol (Anthropic ``system``,
#: Responses ``instructions`` and ``input``, ``messages``, ``tools``); the others (``stream``,
#: ``max_tokens``, sampling options, metadata) leave the conversation as it was.
_CONVERSATION_FIELDS = ("system", "instructions", "messages", "input", "tools")


def runs(root: Path) -> list[Path]:
    """Every run folder (``<harness>/<run>``) under the captures root."""
    return sorted(p for p in root.glob("*/*") if p.is_dir())


def run_names(root: Path = CAPTURES) -> list[str]:
    """The ``<harness>/<run>`` name of every run folder under ``root``, to parametrize a test over
    them all; when there is none (the folder is missing), the one name :data:`NO_RUNS`, on which
    :func:`run_dir` fails, so that such a test fails rather than collecting nothing."""
    return [f"{p.parent.name}/{p.name}" for p in runs(root)] or [NO_RUNS]


def run_dir(name: str, root: Path = CAPTURES) -> Path:
    """The run folder ``<harness>/<run>`` under ``root``.

    Raises:
        pytest.fail.Exception: ``root`` holds no run (:data:`NO_RUNS`), or not this one. The
            captures are part of the test input: CI copies ``../shared`` next to the clone.
    """
    run = root / name
    if name == NO_RUNS:
        pytest.fail(
            f"no harness capture runs (<harness>/<run> folders) in {root}: the captures are "
            "<repository>/../shared/cases/harness-captures, which CI copies next to the clone",
            pytrace=False,
        )
    if not run.is_dir():
        pytest.fail(f"harness capture run {name} is not in {root}", pytrace=False)
    return run


def _pointer(doc: Any, path: str) -> tuple[Any, str | int]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    last: str | int = int(parts[-1]) if isinstance(doc, list) else parts[-1]
    return doc, last


def _apply(body: Any, diff: list[dict[str, Any]]) -> Any | None:
    out = copy.deepcopy(body)
    for op in diff:
        new = op.get("new")
        if isinstance(new, dict) and "_truncated_json" in new:
            return None
        parent, key = _pointer(out, op["path"])
        if op["op"] == "add" and isinstance(parent, list):
            assert isinstance(key, int)
            parent.insert(key, new)
        elif op["op"] == "remove":
            del parent[key]
        else:
            parent[key] = new
    return out


def load_run(run: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The run's request files with a rebuilt ``body``, and the names of those that cannot be rebuilt."""
    files = sorted(run.glob("0*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    first = docs[0]["body"]
    out: list[dict[str, Any]] = []
    skipped: list[str] = []
    for f, d in zip(files, docs, strict=True):
        if d.get("body") is not None:
            body = d["body"]
        elif "body_same_as" in d:
            body = first
        else:
            body = _apply(first, d.get("body_diff_vs_first") or [])
        if body is None:
            skipped.append(f"{run.parent.name}/{run.name}/{f.name}")
            continue
        out.append({**d, "body": body})
    # What the harness got (and so sends back later): read from the captured answer; a
    # fault-injected request gets what the request answered after it got.
    for d in out:
        d["plan"] = answered(d)
    for i, d in enumerate(out):
        if d["plan"] is None:
            d["plan"] = next((e["plan"] for e in out[i + 1 :] if e["plan"]), {"type": "text", "text": "OK."})
    return out, skipped


def samples_of(docs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A run's requests (as :func:`load_run` gives them), grouped by the training sample each
    ends up in when every request is answered in full, as in a replay.

    The rule: a request that follows a fault-injected one (``fault_injected``: an error status or a
    broken stream in the capture) and sends the same conversation (:data:`_CONVERSATION_FIELDS`)
    is a retry, another attempt at the same call; one that sends another conversation shows the
    harness rewrote its history after the fault (OpenClaw, after a cut stream, sends the user
    message again as a queued one), so the answer the replay gave the faulted call is in no later
    history and the sample ends there. Every other request continues the conversation, one
    sample: the proxy splices what harnesses do to their history. A run the harness gave up
    after a fault is one sample too (the replay answers its last request).
    """
    groups: list[list[dict[str, Any]]] = [docs[:1]] if docs else []
    for prev, d in itertools.pairwise(docs):
        if prev["fault_injected"] is not None and _conversation(d) != _conversation(prev):
            groups.append([d])
        else:
            groups[-1].append(d)
    return groups


def _conversation(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d["body"].get(k) for k in _CONVERSATION_FIELDS}


def answered(d: dict[str, Any]) -> dict[str, Any] | None:
    """The visible answer of a captured normal response: text and at most one tool call."""
    resp = d["response"]
    if d["fault_injected"] is not None or resp["status"] != 200:
        return None
    plan = d.get("plan") or {}
    thinking = bool(plan.get("thinking"))
    text = ""
    call: tuple[str, Any] | None = None
    path = d["path"]
    if isinstance(resp["transcript"], dict):
        obj = resp["transcript"]
        if "/messages" in path:
            for b in obj["content"]:
                if b["type"] == "text":
                    text += b["text"]
                elif b["type"] == "tool_use":
                    call = (b["name"], b["input"])
        elif "/responses" in path:
            for item in obj["output"]:
                if item["type"] == "message":
                    text += "".join(p["text"] for p in item["content"])
                elif item["type"] == "function_call":
                    call = (item["name"], json.loads(item["arguments"]))
        else:
            msg = obj["choices"][0]["message"]
            text = msg.get("content") or ""
            for tc in msg.get("tool_calls") or []:
                call = (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
    else:
        for name, data in captured_events(d):
            if not isinstance(data, dict):
                continue
            if name == "content_block_delta" and data["delta"]["type"] == "text_delta":
                text += data["delta"]["text"]
            elif name == "content_block_start" and data["content_block"]["type"] == "tool_use":
                call = (data["content_block"]["name"], None)
            elif name == "response.output_text.done":
                text += data["text"]
            elif name == "response.output_item.done" and data["item"]["type"] == "function_call":
                call = (data["item"]["name"], json.loads(data["item"]["arguments"]))
            elif name == "response.output_item.done" and data["item"]["type"] == "custom_tool_call":
                call = ("custom:" + data["item"]["name"], data["item"]["input"])
            elif name is None and data.get("choices"):
                delta = data["choices"][0]["delta"]
                text += delta.get("content") or ""
                for tc in delta.get("tool_calls") or []:
                    if "id" in tc:
                        call = (tc["function"]["name"], None)
    if call is not None and call[1] is None:
        call = (call[0], plan["args"])  # streamed arguments: the plan holds them whole
    if call is None:
        return {"type": "text", "text": text, "thinking": thinking}
    return {"type": "tool", "name": call[0], "args": call[1], "text": text, "thinking": thinking}


def completion_for(plan: dict[str, Any]) -> str:
    """The completion text the fake engine samples for a capture plan."""
    reasoning = REASONING if plan.get("thinking") else None
    if plan["type"] == "text":
        return final_text(plan["text"], reasoning=reasoning)
    name = plan["name"]
    args = plan["args"]
    if name.startswith("custom:"):
        return tool_call_text(name.split(":", 1)[1], {"input": args}, text=plan.get("text", ""), reasoning=reasoning)
    return tool_call_text(name, args, text=plan.get("text", ""), reasoning=reasoning)


def headers_of(d: dict[str, Any]) -> tuple[dict[str, str], bool]:
    """The captured request headers to resend (minus hop-by-hop and credentials), and whether the
    client authenticated with a Bearer token."""
    h = {k: v for k, v in d["headers"].items() if k.lower() not in _DROP_HEADERS}
    bearer = any(k.lower() == "authorization" for k in d["headers"])
    return h, bearer


def captured_events(d: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The captured SSE answer as (event name, parsed data) pairs."""
    out: list[tuple[str | None, Any]] = []
    for raw in d["response"]["transcript"]:
        event = None
        data: Any = None
        for line in raw.strip("\n").split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                try:
                    data = json.loads(line[6:])
                except json.JSONDecodeError:
                    data = line[6:]
        out.append((event, data))
    return out
