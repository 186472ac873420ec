"""A builder of call records for the proxy's tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from openforge_core.record_delta import RecordBase, RecordCut
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.splice_plan import SpliceReport
from openforge_proxy.domain.tokens import PackedIds, ids_array, pack_ids


def make_record(
    call_id: str = "call0001-abc",
    *,
    prompt: list[int] | None = None,
    completion: list[int] | None = None,
    request_json: bytes = b'{"a":1}',
    canonical_json: bytes = b'{"messages":[]}',
    **fields: Any,
) -> CallRecordData:
    """A record with small defaults (rollout "ro", run "run", attempt 1, Anthropic Messages);
    ``fields`` set any other :class:`CallRecordData` field."""
    prompt = [1, 2, 300] if prompt is None else prompt
    completion = [5, 6] if completion is None else completion
    values: dict[str, Any] = {
        "rollout_id": "ro",
        "run_id": "run",
        "call_id": call_id,
        "attempt": 1,
        "wire_api": WireApi.ANTHROPIC_MESSAGES,
        "model": "m",
        "request_json": request_json,
        "request_headers": {},
        "canonical_json": canonical_json,
        "prompt": PackedIds(ids_array(prompt), pack_ids(prompt)),
        "completion_ids": completion,
        "logprobs": [-0.5] * len(completion),
        "policy_versions": [3] * len(completion),
        "sampling": Sampling(max_tokens=9),
        "finish": Finish.STOP,
        "receive_time": 1.5,
        "ttfb_s": 0.01,
        "total_s": 0.02,
        "splice": SpliceReport(),
    }
    values.update(fields)
    return CallRecordData(**values)


def coded_against(data: CallRecordData, base: RecordBase) -> CallRecordData:
    """``data`` with its cut against ``base``, as the handler computes it (asserted to exist)."""
    cut = RecordCut.of(base, data.prompt.packed, data.request_json, data.canonical_json, prompt_ids=len(data.prompt))
    assert cut is not None, "the record saves too little against this base to be coded"
    return dataclasses.replace(data, cut=cut)
