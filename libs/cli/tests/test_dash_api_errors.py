"""Bad input to the dashboard's JSON API, served against a real trajectory store process (SQLite,
real NATS): every refusal is a JSON ``{"error": {"code", "message"}}`` with the right HTTP status,
never a 500, and no file outside the page's static folder is ever served."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from openforge_cli.dash.server import build_app
from openforge_testing.servers import NatsServer, ServiceProcess


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a real trajectory store on an empty SQLite database."""
    tmp = tmp_path_factory.mktemp("dash-errors")
    with NatsServer(tmp / "nats") as nats:
        env = {"OPENFORGE_NATS__URL": nats.url, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp / 'trajectories.db'}"}
        proc = ServiceProcess("openforge_trajectory_store", env, tmp / "store.log").start()
        try:
            yield proc.address
        finally:
            proc.stop()


@pytest.fixture
async def client(store: str) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_app(store))) as c:
        yield c


async def _error(client: TestClient[Any, Any], path: str, status: int, code: str) -> str:
    resp = await client.get(path)
    assert resp.status == status, (path, resp.status, await resp.text())
    assert resp.content_type == "application/json", (path, await resp.text())
    body = await resp.json()
    assert body["error"]["code"] == code, body
    assert "Traceback" not in body["error"]["message"]
    return str(body["error"]["message"])


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/no-such-run",
        "/api/runs/no-such-run/metrics",
        "/api/rollouts/no-such-rollout",
        "/api/runs/" + "x" * 128,
    ],
)
async def test_unknown_ids_are_404(client: TestClient[Any, Any], path: str) -> None:
    await _error(client, path, 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/runs/" + "x" * 129, "run_id"),
        ("/api/runs/" + "x" * 5000, "run_id"),
        ("/api/runs/" + "x" * 5000 + "/metrics", "run_id"),
        ("/api/runs/" + "%C3%A9" * 1000 + "/rollouts", "run_id"),
        ("/api/runs/" + "x" * 129 + "/outcomes", "run_id"),
        ("/api/rollouts/" + "y" * 5000, "rollout_id"),
    ],
)
async def test_overlong_ids_are_400_naming_the_field(client: TestClient[Any, Any], path: str, field: str) -> None:
    message = await _error(client, path, 400, "INVALID_ARGUMENT")
    assert message.startswith(f"{field}:") and len(message) < 200, message


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/api/runs?page_token=garbage!!", "page_token"),
        ("/api/runs/r/rollouts?page_token=%00%ff", "page_token"),
        ("/api/runs/r/rollouts?min_reward=abc", "min_reward"),
        ("/api/runs/r/rollouts?max_reward=nan", "max_reward"),
        ("/api/runs/r/rollouts?status=BOGUS", "status"),
        ("/api/runs?page_size=-5", "page_size"),
        ("/api/runs?page_size=1e3", "page_size"),
        ("/api/runs?page_size=%C2%B2", "page_size"),  # "²": a digit to str.isdigit, not to int()
        ("/api/runs?page_size=99999999999999999999999", "page_size"),
        ("/api/runs/r/rollouts?page_size=99999999999", "page_size"),
    ],
)
async def test_bad_query_parameters_are_400_naming_the_parameter(
    client: TestClient[Any, Any], path: str, named: str
) -> None:
    assert named in await _error(client, path, 400, "INVALID_ARGUMENT")


async def test_a_huge_page_size_within_range_is_served(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/runs?page_size=2147483647")
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["runs"] == []


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/%ff%fe",  # not UTF-8
        "/api/rollouts/%ed%a0%80",  # an encoded surrogate
    ],
)
async def test_ids_that_are_not_utf8_are_refused_not_500(client: TestClient[Any, Any], path: str) -> None:
    resp = await client.get(path)
    assert resp.status in (400, 404), (resp.status, await resp.text())
    assert resp.content_type == "application/json"


@pytest.mark.parametrize("path", ["/api/nope", "/api/runs/r/nope", "/api/"])
async def test_unknown_api_paths_are_json_404(client: TestClient[Any, Any], path: str) -> None:
    await _error(client, path, 404, "NOT_FOUND")


async def test_wrong_method_on_the_api_is_json_405(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/api/runs", data=b"{}")
    assert resp.status == 405
    assert resp.content_type == "application/json"
    assert (await resp.json())["error"]["code"] == "METHOD_NOT_ALLOWED"


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../etc/passwd",
        "/static/..%2F..%2Fetc%2Fpasswd",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%5C..%5Cetc%5Cpasswd",
        "/static/%252e%252e%252fetc%252fpasswd",
        "/static/....//....//etc/passwd",
        "/static/index.html%00.js",
        "/static/../server.py",
        "/static/%2e%2e%2fserver.py",
        "/static/__init__.py",
        "/static/",
    ],
)
async def test_static_serves_nothing_outside_its_folder(client: TestClient[Any, Any], path: str) -> None:
    resp = await client.get(path, allow_redirects=False)
    body = await resp.read()
    assert b"root:" not in body and b"import" not in body, (path, resp.status)
    assert resp.status in (301, 302, 308, 404), (path, resp.status)


async def test_static_files_of_the_page_are_served(client: TestClient[Any, Any]) -> None:
    for name, kind in (("index.html", "text/html"), ("app.js", "text/javascript"), ("app.css", "text/css")):
        resp = await client.get(f"/static/{name}")
        assert resp.status == 200 and resp.content_type == kind


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_dash_port_out_of_range_is_a_usage_error(port: str) -> None:
    from click.testing import CliRunner

    from openforge_cli.main import main

    result = CliRunner().invoke(main, ["dash", "--port", port])
    assert result.exit_code == 2, result.output
    assert "--port" in result.output and "Traceback" not in result.output
