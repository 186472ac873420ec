"""The proxy as a real process (``python -m openforge_proxy``) with a real NATS and a fake engine.

A session is opened over gRPC; two Claude Code-style calls go over HTTP (the
second sends the first answer back, as the client does); each answered call
arrives on NATS as one ``CallRecorded`` event whose token ids are exactly what
the (fake, scripted) inference engine saw and sampled, with identifiers
scrubbed and no key anywhere.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import nats
from google.protobuf.duration_pb2 import Duration

from openforge.common.v1 import common_pb2
from openforge.proxy.v1 import events_pb2, proxy_pb2, proxy_pb2_grpc
from openforge_core.record_delta import expand_records
from openforge_core.rpc.client import open_channel
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir, final_text, tool_call_text
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer, free_port

DEVICE = "d" * 64
# Long enough (as Claude Code's is) that the second record is coded against the first (RecordDelta).
SYSTEM = "You are Claude Code. " + " ".join(f"Rule {i}: keep the working tree clean." for i in range(300))


def _first_body() -> dict[str, Any]:
    return {
        "model": "policy-model",
        "max_tokens": 32000,
        "stream": True,
        "metadata": {"user_id": json.dumps({"device_id": DEVICE, "account_uuid": "", "session_id": "s1"})},
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "Run bash", "input_schema": {"type": "object"}}],
        "thinking": {"type": "adaptive", "display": "updates"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Create hello.txt"}]},
            {
                "role": "system",
                "content": [{"type": "text", "text": "env", "cache_control": {"type": "ephemeral"}}],
            },
        ],
    }


def _blocks(sse: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for line in sse.split("\n"):
        if not line.startswith("data: "):
            continue
        ev = json.loads(line[6:])
        if ev["type"] == "content_block_start":
            blocks.append({**ev["content_block"], "_j": ""})
        elif ev["type"] == "content_block_delta":
            d = ev["delta"]
            b = blocks[-1]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature"] = d["signature"]
            elif d["type"] == "input_json_delta":
                b["_j"] += d["partial_json"]
    for b in blocks:
        if b["type"] == "tool_use":
            b["input"] = json.loads(b["_j"])
        del b["_j"]
    return blocks


def test_proxy_process_records_calls_on_nats(
    tmp_path: Path, nats_server: NatsServer, service_process: ServiceFactory
) -> None:
    model = build_fake_model_dir(tmp_path / "model", template="qwen3")
    fake = ScriptedInferenceServer(
        model,
        [
            tool_call_text("Bash", {"command": "echo hi > hello.txt"}, text="I'll create the file.", reasoning="Plan."),
            final_text("Done."),
        ],
    )
    fake.start_in_thread()
    http_port = free_port()
    try:
        svc = service_process(
            "openforge_proxy",
            {
                "OPENFORGE_NATS__URL": nats_server.url,
                "OPENFORGE_SERVICES__INFERENCE": fake.address,
                "OPENFORGE_HTTP__PORT": str(http_port),
            },
        )
        sent = asyncio.run(_rollout(svc.address, http_port, nats_server.url))
    finally:
        fake.stop_thread()
    # the second event carries only what is new since the first; expanded, both are full records
    assert not sent[0].HasField("delta") and sent[1].HasField("delta")
    assert (sent[1].delta.base_call_id, sent[1].delta.base_attempt) == (sent[0].call_id, 1)
    assert len(sent[1].request_json) < len(sent[0].request_json) // 4
    assert len(sent[1].prompt_token_ids) < len(sent[0].prompt_token_ids) // 4
    records = expand_records(sent)
    assert not records[1].HasField("delta")
    assert next(r.call_id for r in records) != records[1].call_id
    for rec, seen in zip(records, fake.seen, strict=True):
        assert list(rec.prompt_token_ids) == seen.prompt_ids
        assert list(rec.completion_token_ids) == seen.sampled_ids
        assert list(rec.completion_policy_versions) == [fake.policy_version] * len(seen.sampled_ids)
        assert rec.rollout_id == "ro-1" and rec.run_id == "run-1" and rec.attempt == 1 and rec.http_status == 200
        assert DEVICE.encode() not in rec.request_json and b"<scrubbed>" in rec.request_json
        assert json.loads(rec.request_json)["system"][0]["text"] == SYSTEM
        assert "x-api-key" not in rec.request_headers
        assert rec.response_body.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        assert rec.sampling.temperature == 0.5 and rec.stream
    first, second = records
    seq = list(first.prompt_token_ids) + list(first.completion_token_ids)
    assert list(second.prompt_token_ids[: len(seq)]) == seq
    assert second.splice.extends_call_id == first.call_id
    assert second.splice.reused[0].source_call_id == first.call_id
    assert svc.stop() == 0
    assert "ofk-" not in svc.log()


async def _rollout(grpc_address: str, http_port: int, nats_url: str) -> list[Any]:
    async with open_channel(grpc_address) as ch:
        stub = proxy_pb2_grpc.ProxyServiceStub(ch)
        created = await stub.CreateSession(
            proxy_pb2.CreateSessionRequest(
                request_id="q1",
                rollout_id="ro-1",
                run_id="run-1",
                model_name="policy-model",
                ttl=Duration(seconds=600),
                sampling=common_pb2.SamplingParams(temperature=0.5, max_tokens=256),
            )
        )
    key = created.api_key
    url = f"http://127.0.0.1:{http_port}/v1/messages?beta=true"
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01", "X-Claude-Code-Session-Id": "s1"}
    body = _first_body()
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200
            first = await resp.text()
        body["messages"] = [
            *body["messages"][:1],
            {"role": "system", "content": "env"},  # blocks → string, as Claude Code does
            {"role": "assistant", "content": _blocks(first)},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": next(b["id"] for b in _blocks(first) if b["type"] == "tool_use"),
                        "content": "hi",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ]
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200
            second = await resp.text()
    assert [b.get("text") for b in _blocks(second)] == ["Done."]
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe("openforge.proxy.v1.call_recorded", durable="proxy-process-test")
        msgs = await sub.fetch(2, timeout=10)
        out = []
        for m in msgs:
            ev = events_pb2.CallRecorded.FromString(m.data)
            assert m.headers is not None and m.headers["Nats-Msg-Id"] == ev.event_id
            out.append(ev.record)
            await m.ack()
        return out
    finally:
        await nc.close()
