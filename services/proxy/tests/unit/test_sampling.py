"""The session's ``SamplingParams`` become one :class:`Sampling` per call, which the engine request,
the call record and the Responses echo all read; ``seed`` stays an int64 from ``CreateSession``
to the recorded event."""

from __future__ import annotations

from typing import Any, cast

from record_builders import make_record

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2
from openforge.proxy.v1 import events_pb2, proxy_pb2
from openforge_proxy.adapters.inference import generate_request_bytes
from openforge_proxy.adapters.publisher import event_bytes, record_proto
from openforge_proxy.domain.conversation import CanonicalRequest, WireApi
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.output import AssistantOutput
from openforge_proxy.domain.protocols.responses import response_object
from openforge_proxy.domain.sessions import SessionRegistry
from openforge_proxy.domain.tokens import PackedIds, ids_array, pack_ids
from openforge_proxy.servicer import ProxyServicer

#: Above 2**53: a JSON number (a double) could not carry it, a JSON string would not be an int.
SEED = 2**53 + 1


def _echo(sampling: Sampling) -> tuple[object, object]:
    out = AssistantOutput(ids={"response": "resp_1"})
    body = response_object(
        CanonicalRequest(WireApi.OPENAI_RESPONSES, "m", []),
        out,
        sampling,
        status="completed",
        created_at=0,
        output=[],
        usage=None,
    )
    return body["temperature"], body["top_p"]


async def test_a_seed_goes_from_create_session_to_the_engine_and_the_record_as_an_int() -> None:
    sessions = SessionRegistry(3600, 10)
    servicer = ProxyServicer(sessions, lambda: None)
    enforced = common_pb2.SamplingParams(temperature=0.7, max_tokens=48, seed=SEED, top_k=0, stop_token_ids=[7])
    request = proxy_pb2.CreateSessionRequest(request_id="q1", rollout_id="r1", run_id="run", sampling=enforced)
    response = await servicer.CreateSession(request, cast(Any, None))
    assert response.session.sampling == enforced
    session = sessions.get("r1")
    assert session.sampling == enforced and type(session.sampling.seed) is int

    sampling = Sampling.enforced(session.sampling, max_tokens=16)
    assert sampling == Sampling(max_tokens=16, temperature=0.7, seed=SEED, stop_token_ids=(7,))
    assert type(sampling.seed) is int

    prompt = PackedIds(ids_array([1, 2]), pack_ids([1, 2]))
    sent = inference_pb2.GenerateRequest.FromString(generate_request_bytes("g1", prompt, sampling)).sampling
    record = make_record(sampling=sampling)
    published = events_pb2.CallRecorded.FromString(event_bytes(record)).record.sampling
    expected = common_pb2.SamplingParams(temperature=0.7, max_tokens=16, seed=SEED, stop_token_ids=[7])
    for msg in (sampling.to_proto(), sent, record_proto(record).sampling, published):
        assert msg == expected and msg.seed == SEED and not msg.HasField("top_p") and not msg.HasField("top_k")
    assert _echo(sampling) == (0.7, 1.0)  # the value the trainer wrote, not float32's 0.699999988...


def test_unset_fields_stay_unset_and_set_zeros_stay_set() -> None:
    nothing = Sampling.enforced(common_pb2.SamplingParams(), max_tokens=5)
    assert nothing == Sampling(max_tokens=5)
    assert nothing.to_proto() == common_pb2.SamplingParams(max_tokens=5) and _echo(nothing) == (1.0, 1.0)
    greedy = Sampling.enforced(common_pb2.SamplingParams(temperature=0.0, seed=0, top_p=0.9), max_tokens=5)
    assert (greedy.temperature, greedy.seed, greedy.top_p) == (0.0, 0, 0.9)
    proto = greedy.to_proto()
    assert proto.HasField("temperature") and proto.HasField("seed") and proto.seed == 0
    assert _echo(greedy) == (0.0, 0.9)
