"""The dashboard's HTTP server: the static page and JSON endpoints backed by the store's gRPC API.

Endpoints (all ``GET``, JSON; shapes in :mod:`.views`):

* ``/api/runs?page_token=`` → ``{"runs": [run], "next_page_token"}``, newest first.
* ``/api/runs/{run_id}`` → ``{"run": run}``.
* ``/api/runs/{run_id}/metrics`` → ``{"steps": [step], "metric_names": [str]}`` in step order
  (at most :data:`MAX_STEPS` steps).
* ``/api/runs/{run_id}/rollouts?task=&status=&min_reward=&max_reward=&page_size=&page_token=`` →
  ``{"rollouts": [rollout], "next_page_token"}``, newest first; ``status`` is a status name
  (``SUCCEEDED``, ``FAILED``, ``TIMED_OUT``...).
* ``/api/resources`` → :func:`views.resource_curves` of the run folder's resource log (with
  ``--state-dir``; empty curves otherwise).
* ``/api/rollouts/{rollout_id}`` → ``{"rollout", "calls": [call], "samples": [sample],
  "samples_note", "tokenizer"}``: the trajectory view. ``samples_note`` says why there are no
  samples yet (the rollout has not ended); ``tokenizer`` says which model folder decoded the tokens
  (``--model-dir``, else the manifest's ``model`` when it is a local folder) and whether its
  ``tokenizer.json`` has the hash the run's manifest recorded.

Errors answer ``{"error": {"code", "message"}}`` with the HTTP status of the store's gRPC code
(NOT_FOUND 404, INVALID_ARGUMENT 400, FAILED_PRECONDITION 409, UNAVAILABLE 503, else 502), 400
for a bad query parameter, 404/405 for an unknown ``/api/`` path or method, and 500 (code
``INTERNAL``, the exception's type only; the traceback goes to the log) for a defect.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_cli.compare import RolloutCost, rollout_cost
from openforge_cli.dash import views
from openforge_cli.train_config import EVAL_PHASES, eval_run_id
from openforge_core.rpc.client import open_channel

if TYPE_CHECKING:
    from openforge.trajectory.v1.trajectory_pb2_grpc import TrajectoryServiceAsyncStub

_log = logging.getLogger(__name__)

SERVICE = "openforge.trajectory.v1.TrajectoryService"
READS = ("GetRollout", "ListRollouts", "GetCalls", "GetSamples", "ListRuns", "GetRun", "ListStepMetrics")
#: Steps the metrics endpoint reads at most (the curves' x range).
MAX_STEPS = 100_000
#: Rollouts the outcomes endpoint reads at most.
MAX_ROLLOUTS = 100_000
#: Rollouts whose calls and samples the outcomes endpoint reads, at most, for the per-harness
#: turns, tokens and samples of a run that used several harnesses.
MAX_COSTED = 500
#: Largest integer query parameter (the store's fields are int32).
MAX_INT32 = 2**31 - 1
STATIC = {"index.html": "text/html", "app.js": "text/javascript", "app.css": "text/css"}

STUB_KEY: web.AppKey[TrajectoryServiceAsyncStub] = web.AppKey("stub")
DECODERS_KEY: web.AppKey[dict[Path, views.TokenDecoder | None]] = web.AppKey("decoders")
MODEL_DIR_KEY: web.AppKey[Path | None] = web.AppKey("model_dir")
STATE_DIR_KEY: web.AppKey[Path | None] = web.AppKey("state_dir")

_HTTP_OF_GRPC = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class BadParam(Exception):
    """A query parameter the endpoint cannot use."""


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    try:
        return await handler(request)
    except BadParam as exc:
        return _error(400, "INVALID_ARGUMENT", str(exc))
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        return _error(_HTTP_OF_GRPC.get(code, 502), code.name, exc.details() or code.name)
    except web.HTTPException as exc:
        if not request.path.startswith("/api/") or exc.status < 400:
            raise
        name = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status, "INVALID_ARGUMENT")
        return _error(exc.status, name, f"{request.method} {request.path[:200]}: {exc.reason}")
    except Exception as exc:
        if not request.path.startswith("/api/"):
            raise
        _log.exception("dashboard request %s failed", request.path[:200])
        return _error(500, "INTERNAL", f"internal error ({type(exc).__name__}); see the dashboard's log")


def _float(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadParam(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise BadParam(f"{name} must be finite")
    return value


def _int(request: web.Request, name: str) -> int:
    raw = request.query.get(name, "").strip()
    if not raw:
        return 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or int(raw) > MAX_INT32:
        raise BadParam(f"{name} must be an integer in [0, {MAX_INT32}], got {raw[:40]!r}")
    return int(raw)


def _status(request: web.Request) -> int:
    raw = request.query.get("status", "").strip().upper()
    if not raw:
        return common_pb2.ROLLOUT_STATUS_UNSPECIFIED
    try:
        return int(common_pb2.RolloutStatus.Value("ROLLOUT_STATUS_" + raw.removeprefix("ROLLOUT_STATUS_")))
    except ValueError:
        names = [n.removeprefix("ROLLOUT_STATUS_") for n in common_pb2.RolloutStatus.keys()[1:]]
        raise BadParam(f"status must be one of {', '.join(names)}, got {raw!r}") from None


def _stub(request: web.Request) -> TrajectoryServiceAsyncStub:
    return request.app[STUB_KEY]


async def index(request: web.Request) -> web.Response:
    """The page."""
    return await static(request, "index.html")


async def static(request: web.Request, name: str | None = None) -> web.Response:
    """One of the page's static files (package data under ``static/``)."""
    name = name or request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    body = (resources.files("openforge_cli.dash") / "static" / name).read_bytes()
    return web.Response(body=body, content_type=STATIC[name], headers={"Cache-Control": "no-cache"})


async def list_runs(request: web.Request) -> web.Response:
    """``{"runs": [...], "next_page_token"}`` from ListRuns."""
    req = trajectory_pb2.ListRunsRequest(
        page_size=_int(request, "page_size"), page_token=request.query.get("page_token", "")
    )
    resp = await _stub(request).ListRuns(req)
    return web.json_response({"runs": [views.run(r) for r in resp.runs], "next_page_token": resp.next_page_token})


async def get_run(request: web.Request) -> web.Response:
    """``{"run": ...}`` from GetRun."""
    resp = await _stub(request).GetRun(trajectory_pb2.GetRunRequest(run_id=request.match_info["run_id"]))
    return web.json_response({"run": views.run(resp.run)})


async def run_metrics(request: web.Request) -> web.Response:
    """``{"steps": [...], "metric_names": [...], "evals": [...]}``: every page of ListStepMetrics (up
    to :data:`MAX_STEPS`), and the held-out evaluations ``openforge train`` ran before and after
    this run (``{"key", "label", "run_id", "reward"}`` each, mean reward from GetRun; absent when the
    store has no such run)."""
    run_id = request.match_info["run_id"]
    stub = _stub(request)
    found = await _every_page(
        lambda token: stub.ListStepMetrics(
            trajectory_pb2.ListStepMetricsRequest(run_id=run_id, page_size=1000, page_token=token)
        ),
        lambda resp: resp.steps,
        MAX_STEPS,
    )
    steps = [views.step(s) for s in found]
    names = sorted({k for s in steps for k in s["metrics"]})
    evals: list[dict[str, Any]] = []
    for key, label in EVAL_PHASES:
        try:
            got = await _stub(request).GetRun(trajectory_pb2.GetRunRequest(run_id=eval_run_id(run_id, key)))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                continue
            raise
        if got.run.HasField("mean_reward"):
            evals.append({"key": key, "label": label, "run_id": got.run.run_id, "reward": got.run.mean_reward})
    return web.json_response({"steps": steps, "metric_names": names, "evals": evals})


async def run_rollouts(request: web.Request) -> web.Response:
    """``{"rollouts": [...], "next_page_token"}`` from ListRollouts with the query's filters."""
    req = trajectory_pb2.ListRolloutsRequest(
        run_id=request.match_info["run_id"],
        task_id=request.query.get("task", "").strip(),
        status=_status(request),  # type: ignore[arg-type]
        page_size=_int(request, "page_size"),
        page_token=request.query.get("page_token", ""),
    )
    lo, hi = _float(request, "min_reward"), _float(request, "max_reward")
    if lo is not None:
        req.min_reward = lo
    if hi is not None:
        req.max_reward = hi
    resp = await _stub(request).ListRollouts(req)
    return web.json_response(
        {"rollouts": [views.rollout(r) for r in resp.rollouts], "next_page_token": resp.next_page_token}
    )


async def get_resources(request: web.Request) -> web.Response:
    """The resource curves of the run folder (``--state-dir``); see :func:`views.resource_curves`."""
    from openforge_cli.resource_log import read

    state_dir = request.app[STATE_DIR_KEY]
    samples = await asyncio.to_thread(read, state_dir) if state_dir is not None else []
    return web.json_response(views.resource_curves(samples))


async def run_outcomes(request: web.Request) -> web.Response:
    """``{"statuses": {...}, "causes": [...], "harnesses": [...]}`` (:func:`views.outcomes`) over
    every rollout of the run (every page of ListRollouts, up to :data:`MAX_ROLLOUTS`); when the
    run used several harnesses, with what each ended rollout cost (its calls and samples, up to
    :data:`MAX_COSTED` rollouts; one not assembled yet is left out)."""
    stub, run_id = _stub(request), request.match_info["run_id"]
    found = await _every_page(
        lambda token: stub.ListRollouts(
            trajectory_pb2.ListRolloutsRequest(run_id=run_id, page_size=1000, page_token=token)
        ),
        lambda resp: resp.rollouts,
        MAX_ROLLOUTS,
    )
    costs: dict[str, RolloutCost] = {}
    if len({r.harness for r in found}) > 1:
        for r in [r for r in found if r.HasField("end_time")][:MAX_COSTED]:
            try:
                costs[r.rollout_id] = await rollout_cost(stub, r.rollout_id)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
    return web.json_response(views.outcomes(found, costs=costs))


async def _every_page(fetch: Callable[[str], Awaitable[Any]], items: Callable[[Any], Any], limit: int) -> list[Any]:
    """The items of every page ``fetch(page_token)`` returns, until the last page or ``limit`` items."""
    out: list[Any] = []
    token = ""
    while len(out) < limit:
        resp = await fetch(token)
        out += items(resp)
        token = resp.next_page_token
        if not token:
            break
    return out


def _decoder(app: web.Application, manifest: common_pb2.RunManifest | None) -> tuple[views.TokenDecoder | None, str]:
    """The decoder of ``--model-dir``, else of the manifest's model folder, cached; and its source."""
    model_dir, source = app[MODEL_DIR_KEY], "--model-dir"
    if model_dir is None and manifest is not None and manifest.model and Path(manifest.model).is_dir():
        model_dir, source = Path(manifest.model), "manifest"
    if model_dir is None:
        return None, ""
    cache = app[DECODERS_KEY]
    if model_dir not in cache:
        try:
            cache[model_dir] = views.TokenDecoder(model_dir)
        except Exception:  # no tokenizer.json, or one the tokenizers library cannot read: show ids
            cache[model_dir] = None
    return cache[model_dir], source


async def get_rollout(request: web.Request) -> web.Response:
    """The trajectory view of one rollout: the rollout, its calls and its samples."""
    stub = _stub(request)
    rollout_id = request.match_info["rollout_id"]
    rollout = (await stub.GetRollout(trajectory_pb2.GetRolloutRequest(rollout_id=rollout_id))).rollout
    calls = (await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=rollout_id))).calls
    samples: list[trajectory_pb2.Sample] = []
    note = ""
    try:
        samples = list((await stub.GetSamples(trajectory_pb2.GetSamplesRequest(rollout_id=rollout_id))).samples)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
        note = exc.details() or "not assembled yet"
    manifest: common_pb2.RunManifest | None = None
    try:
        summary = (await stub.GetRun(trajectory_pb2.GetRunRequest(run_id=rollout.run_id))).run
        manifest = summary.manifest if summary.HasField("manifest") else None
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
    decoder, source = await asyncio.to_thread(_decoder, request.app, manifest)
    expected = manifest.tokenizer_hash if manifest is not None else ""
    tokenizer = {
        "model_dir": str(decoder.model_dir) if decoder else None,
        "source": source if decoder else None,
        "matches_manifest": (decoder.sha256 == expected) if decoder and expected else None,
    }

    def body() -> dict[str, Any]:
        return {
            "rollout": views.rollout(rollout),
            "calls": [views.call(c, decoder) for c in calls],
            "samples": [views.sample(s, decoder) for s in samples],
            "samples_note": note,
            "tokenizer": tokenizer,
        }

    return web.json_response(await asyncio.to_thread(body))


def build_app(store: str, model_dir: Path | None = None, state_dir: Path | None = None) -> web.Application:
    """The dashboard application.

    Args:
        store: ``host:port`` of the trajectory store's gRPC server.
        model_dir: Model folder whose ``tokenizer.json`` decodes token ids (else the run
            manifest's ``model`` when it is a local folder, else ids only).
        state_dir: The run folder whose resource log ``/api/resources`` reads (None: none).

    Returns:
        The aiohttp application; the store channel opens on startup and closes on cleanup.
    """
    app = web.Application(middlewares=[_errors])
    app[MODEL_DIR_KEY] = model_dir
    app[STATE_DIR_KEY] = state_dir
    app[DECODERS_KEY] = {}

    async def channel(app: web.Application) -> AsyncIterator[None]:
        ch = open_channel(store, service=SERVICE, idempotent_methods=READS)
        app[STUB_KEY] = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        yield
        await ch.close()

    app.cleanup_ctx.append(channel)
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/runs", list_runs)
    app.router.add_get("/api/runs/{run_id}", get_run)
    app.router.add_get("/api/runs/{run_id}/metrics", run_metrics)
    app.router.add_get("/api/runs/{run_id}/rollouts", run_rollouts)
    app.router.add_get("/api/runs/{run_id}/outcomes", run_outcomes)
    app.router.add_get("/api/resources", get_resources)
    app.router.add_get("/api/rollouts/{rollout_id}", get_rollout)
    return app


def serve(store: str, host: str, port: int, model_dir: Path | None, state_dir: Path | None = None) -> None:
    """Serves the dashboard until SIGINT/SIGTERM (blocking).

    Args:
        store: ``host:port`` of the trajectory store's gRPC server.
        host: Interface to bind.
        port: TCP port to bind.
        model_dir: See :func:`build_app`.
        state_dir: See :func:`build_app`.
    """
    web.run_app(
        build_app(store, model_dir, state_dir),
        host=host,
        port=port,
        print=lambda _: print(f"Dashboard on http://{host}:{port}/ (store {store}); Ctrl-C stops it.", flush=True),
        access_log=None,
    )
