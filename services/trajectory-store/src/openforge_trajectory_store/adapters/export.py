"""Exports of a run's samples: Parquet in veRL's layout, or JSONL.

Parquet columns (one row per sample), matching what veRL's multi-turn agent
loop produces (``AgentLoopOutput``: prompt_ids, response_ids, response_mask,
response_logprobs) and its GRPO grouping key (``uid``):

====================  ==================  =============================================
column                type                meaning
====================  ==================  =============================================
prompt_ids            list<int32>         the first call's prompt tokens
response_ids          list<int32>         every token after the prompt
response_mask         list<int8>          1 = sampled by the policy (trained on), 0 = not
rollout_log_probs     list<float32>       behaviour logprob per response token (0 if mask 0)
policy_versions       list<int64>         policy version per response token (0 if mask 0)
reward                float64 (nullable)  the rollout's verifier reward; null when it has
                                          none (failed, cancelled, bypassed the proxy): such
                                          samples are for inspection, never trained as 0
uid                   string              group id (GRPO/RLOO group key)
rollout_id            string              rollout
sample_id             string              "<rollout_id>/<index>"
task_id               string              task
group_index           int32               repetition index within the group
break_cause           string              why the sample starts here (NONE for the first)
partial               bool                the rollout timed out / failed
requests              string (JSON)       the harness requests of the sample's calls
                                          (only with include_requests)
====================  ==================  =============================================

Files are created owner-only (0600), only inside the store's export folder (:func:`export_path`).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from google.protobuf import json_format

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_core import field_rules
from openforge_core.errors import InvalidArgument

SCHEMA = pa.schema(
    [
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())),
        ("rollout_log_probs", pa.list_(pa.float32())),
        ("policy_versions", pa.list_(pa.int64())),
        ("reward", pa.float64()),
        ("uid", pa.string()),
        ("rollout_id", pa.string()),
        ("sample_id", pa.string()),
        ("task_id", pa.string()),
        ("group_index", pa.int32()),
        ("break_cause", pa.string()),
        ("partial", pa.bool_()),
    ]
)


def rows(
    items: Sequence[tuple[common_pb2.Rollout, trajectory_pb2.Sample]],
    requests: dict[str, dict[str, object]] | None,
) -> list[dict[str, object]]:
    """One dict per sample with the export columns (``requests`` keyed by call id, when included)."""
    out: list[dict[str, object]] = []
    for r, s in items:
        row: dict[str, object] = {
            "prompt_ids": list(s.prompt_token_ids),
            "response_ids": list(s.response_token_ids),
            "response_mask": list(s.loss_mask),
            "rollout_log_probs": list(s.rollout_logprobs),
            "policy_versions": list(s.policy_versions),
            "reward": r.reward if r.HasField("reward") else None,
            "uid": r.group_id,
            "rollout_id": r.rollout_id,
            "sample_id": s.sample_id,
            "task_id": r.task_id,
            "group_index": r.group_index,
            "break_cause": common_pb2.BreakCause.Name(s.break_cause).removeprefix("BREAK_CAUSE_"),
            "partial": s.partial,
        }
        if requests is not None:
            row["requests"] = json.dumps([requests.get(c, {}) for c in s.call_ids])
        out.append(row)
    return out


def request_bodies(calls: Sequence[common_pb2.CallRecord]) -> dict[str, dict[str, object]]:
    """The recorded request body per call id (the attempt recorded last)."""
    return {c.call_id: json_format.MessageToDict(c.request) for c in calls}


def _open_owner_only(path: Path) -> int:
    # The folder is the configured export folder; a name inside it that is a symbolic link is
    # refused (O_NOFOLLOW), so an export never writes through a link to somewhere else.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidArgument.field("file_name", "names a symbolic link in the export folder") from exc
        if exc.errno in (errno.EISDIR, errno.ENOTDIR):
            raise InvalidArgument.field("file_name", "names a folder in the export folder") from exc
        raise
    os.fchmod(fd, 0o600)
    return fd


def export_path(folder: Path, file_name: str) -> Path:
    """The file ``file_name`` inside the export folder.

    Args:
        folder: The store's export folder (``StoreSettings.export_dir``).
        file_name: A plain file name (:data:`openforge_core.field_rules.FILE_NAME`).

    Raises:
        InvalidArgument: ``file_name`` is empty or not a plain file name (a path, a leading dot,
            a NUL...), so the file could land outside ``folder``.
    """
    field_rules.check("file_name", file_name)
    path = folder / file_name
    if path.parent != folder:  # the rule already refuses separators; this keeps it so
        raise InvalidArgument.field("file_name", "must be a file name, not a path")
    return path


def write_parquet(path: Path, data: list[dict[str, object]], include_requests: bool) -> int:
    """Writes rows to a Parquet file created owner-only; returns the row count."""
    schema = SCHEMA.append(pa.field("requests", pa.string())) if include_requests else SCHEMA
    table = pa.Table.from_pylist(data, schema=schema)
    fd = _open_owner_only(path)
    with os.fdopen(fd, "wb") as f:
        pq.write_table(table, f)
    return int(table.num_rows)


def write_jsonl(path: Path, data: list[dict[str, object]]) -> int:
    """Writes one JSON object per row to a file created owner-only; returns the row count."""
    fd = _open_owner_only(path)
    with os.fdopen(fd, "w") as f:
        for row in data:
            f.write(json.dumps(row) + "\n")
    return len(data)
