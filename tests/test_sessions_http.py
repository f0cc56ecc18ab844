"""The sessions HTTP API (homing.sessions.asgi) in process, on both backends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import homing
from homing.sessions import Server
from homing.sessions.asgi import client_token, create_app

SECRET = "test-secret-0123456789abcdef"


class AppClient:
    """A synchronous face over ``httpx.ASGITransport``: the app runs in process. Sends the
    bearer token of the client named in the path (``/clients/{id}/...``) unless told
    otherwise (``auth=False``)."""

    def __init__(self, app: Any, *, auth: bool = True) -> None:
        self.transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
        self.auth = auth

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        match = re.search(r"/clients/([^/]+)/", path)
        if self.auth and match and "authorization" not in kwargs.get("headers", {}):
            token = client_token(SECRET, match.group(1))
            kwargs["headers"] = {**kwargs.get("headers", {}), "authorization": f"Bearer {token}"}

        async def go() -> httpx.Response:
            async with httpx.AsyncClient(transport=self.transport, base_url="http://t") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(go())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)


@pytest.fixture
def http(db: homing.Database) -> Iterator[AppClient]:
    yield AppClient(create_app(db, secret=SECRET))


def serve(db: homing.Database) -> int:
    return Server(db, "orders", lambda r, t: {"total": r.body["qty"] * 3}).run(until_idle=True)


def test_walk_through_the_four_states(http: AppClient, db: homing.Database) -> None:
    r = http.post("/clients/shop-1/session", json={"keep_replies": 10})
    assert r.status_code == 201 and r.json()["reestablished"] is False
    r = http.post("/clients/shop-1/session")
    assert r.status_code == 200 and r.json()["reestablished"] is True
    assert r.json()["connects"] == 2

    # A: Transaction 0 only
    r = http.post("/clients/shop-1/prepare", json={"queue": "orders", "body": {"qty": 2}})
    assert r.status_code == 201
    rid = r.json()["request_id"]
    rec = http.get("/clients/shop-1/recover").json()
    assert rec["last"]["state"] == "A" and rec["last"]["action"] == "resubmit_or_drop"
    assert rec["last"]["body"] == {"qty": 2}
    assert http.post("/clients/shop-1/resubmit").json()["request_id"] == rid
    # B
    rec = http.get("/clients/shop-1/recover").json()
    assert (rec["last"]["state"], rec["last_enqueued_id"]) == ("B", rid)
    assert http.post("/clients/shop-1/replies/take").status_code == 204
    # C
    serve(db)
    rec = http.get("/clients/shop-1/recover").json()
    assert rec["last"]["state"] == "C" and rec["last"]["reply"]["body"] == {"total": 6}
    peek = http.get("/clients/shop-1/replies/next")
    assert peek.status_code == 200 and peek.json()["request_id"] == rid
    r = http.post("/clients/shop-1/replies/take", json={"request_id": rid})
    assert r.status_code == 200 and r.json()["body"] == {"total": 6} and r.json()["ok"]
    # D
    rec = http.get("/clients/shop-1/recover").json()
    assert rec["last"]["state"] == "D" and rec["last_dequeued_id"] == rid
    assert http.post("/clients/shop-1/replies/confirm", json={"request_ids": [rid]}).json() == {
        "forgotten": 1
    }
    looked = http.get(f"/clients/shop-1/requests/{rid}").json()
    assert looked["state"] == "taken" and looked["reply"] == {"total": 6}
    assert looked["confirmed_at"] is not None
    info = http.get("/clients/shop-1/session").json()
    assert info["unfinished"] == [] and info["dequeued"] == []
    assert http.delete("/clients/shop-1/session").status_code == 204
    assert http.get("/clients/shop-1/session").status_code == 404


def test_submit_and_client_kept_last_request(http: AppClient, db: homing.Database) -> None:
    http.post("/clients/c/session")
    rid = homing.uuid7()
    r = http.get("/clients/c/recover", params={"last_request_id": rid})
    assert r.json()["last"]["state"] == "A"
    r = http.post(
        "/clients/c/requests",
        json={"queue": "orders", "body": {"qty": 1}, "request_id": rid, "remember": False},
    )
    assert r.status_code == 201 and r.json()["request_id"] == rid
    assert (
        http.get("/clients/c/recover", params={"last_request_id": rid}).json()["last"]["state"]
        == "B"
    )
    serve(db)
    r = http.post("/clients/c/replies/take", json={"timeout": 1})
    assert r.status_code == 200 and r.json()["request_id"] == rid


def test_drop(http: AppClient) -> None:
    http.post("/clients/c/session")
    http.post("/clients/c/prepare", json={"queue": "orders", "body": 1})
    assert http.post("/clients/c/drop").json()["body"] == 1
    assert http.get("/clients/c/recover").json()["last"] is None
    assert http.post("/clients/c/drop").status_code == 409


BAD: list[tuple[str, str, Any, int, str]] = [
    # method, path, body (bytes or json), status, text in the error
    ("get", "/clients/ghost/session", None, 404, "no session"),
    ("post", "/clients/ghost/requests", {"queue": "q", "body": 1}, 404, "no session"),
    ("get", "/clients/ghost/recover", None, 404, "no session"),
    ("post", "/clients/ghost/replies/take", None, 404, "no session"),
    ("get", "/clients/c/requests/nope", None, 404, "no request"),
    ("post", "/clients/c/requests", b"{not json", 400, "invalid JSON"),
    ("post", "/clients/c/requests", b'{"queue": "q", "body": NaN}', 400, "NaN"),
    ("post", "/clients/c/requests", b'{"queue": "q", "queue": "r"}', 400, "twice"),
    ("post", "/clients/c/requests", b"[1, 2]", 400, "JSON object"),
    ("post", "/clients/c/requests", b"", 400, "JSON object body"),
    ("post", "/clients/c/requests", b"\xff\xfe", 400, "UTF-8"),
    ("post", "/clients/c/requests", b'{"body": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "deep"),
    ("post", "/clients/c/requests", b'{"queue": "q", "body": 1' + b"0" * 5000 + b"}", 400, "JSON"),
    ("post", "/clients/c/requests", {"body": 1}, 400, "queue"),
    ("post", "/clients/c/requests", {"queue": "", "body": 1}, 400, "queue"),
    ("post", "/clients/c/requests", {"queue": {"a": 1}}, 400, "queue"),
    ("post", "/clients/c/requests", {"queue": "q", "request_id": 5}, 400, "request id"),
    ("post", "/clients/c/requests", {"queue": "q", "remember": "yes"}, 400, "remember"),
    ("post", "/clients/c/requests", {"queue": "q", "extra": 1}, 400, "unknown field"),
    ("post", "/clients/c/requests", {"queue": "q", "body": "x" * 2_000_000}, 413, "limit"),
    ("post", "/clients/c/replies/confirm", {"request_ids": "abc"}, 400, "list"),
    ("post", "/clients/c/replies/confirm", {}, 400, "request_ids"),
    ("post", "/clients/c/replies/confirm", {"request_ids": ["never"]}, 409, "never dequeued"),
    ("post", "/clients/c/replies/take", {"timeout": "soon"}, 400, "timeout"),
    ("post", "/clients/c/replies/take", {"timeout": 1e9}, 400, "timeout"),
    ("post", "/clients/c/session", {"keep_replies": -1}, 400, "keep_replies"),
    ("post", "/clients/c/session", {"keep_replies": True}, 400, "keep_replies"),
    ("post", "/clients/c/resubmit", None, 409, "no unsubmitted"),
]


def test_bad_input_gets_a_clear_4xx(http: AppClient) -> None:
    http.post("/clients/c/session")
    for method, path, body, status, text in BAD:
        case = f"{method} {path} {str(body)[:60]}"
        kwargs: dict[str, Any] = {}
        if isinstance(body, bytes):
            kwargs["content"] = body
        elif body is not None:
            kwargs["json"] = body
        r = http.request(method.upper(), path, **kwargs)
        assert r.status_code == status, (case, r.text)
        assert text in r.json()["error"], (case, r.json())
        # nothing was written by the bad call
        info = http.get("/clients/c/session").json()
        assert info["unfinished"] == [] and info["last_request_id"] is None, case


def test_duplicate_request_id_is_409(http: AppClient) -> None:
    http.post("/clients/c/session")
    rid = homing.uuid7()
    body = {"queue": "q", "body": 1, "request_id": rid}
    assert http.post("/clients/c/requests", json=body).status_code == 201
    r = http.post("/clients/c/requests", json=body)
    assert r.status_code == 409 and r.json()["type"] == "DuplicateRequest"


def test_lying_content_length(http: AppClient) -> None:
    http.post("/clients/c/session")
    r = http.post(
        "/clients/c/requests",
        content=b'{"queue": "q"}',
        headers={"content-length": "99999999999", "content-type": "application/json"},
    )
    assert r.status_code == 413


def test_mounted_at_sessions_like_homing_serve(db: homing.Database) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    app = create_app(db, secret=SECRET)
    outer = AppClient(Starlette(routes=[Mount("/sessions", app=app)]))
    assert outer.post("/sessions/clients/m/session").status_code == 201
    r = outer.post("/sessions/clients/m/requests", json={"queue": "orders", "body": {"qty": 1}})
    assert r.status_code == 201
    rid = r.json()["request_id"]
    assert outer.get(f"/sessions/clients/m/requests/{rid}").json()["state"] == "queued"


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = st.sampled_from(
    ["queue", "body", "request_id", "remember", "request_ids", "keep_replies", "timeout", "x"]
)
ROUTES = st.sampled_from(
    [
        ("POST", "/clients/f/requests"),
        ("POST", "/clients/f/prepare"),
        ("POST", "/clients/f/replies/take"),
        ("POST", "/clients/f/replies/confirm"),
        ("POST", "/clients/f/session"),
        ("POST", "/clients/f/resubmit"),
        ("POST", "/clients/f/drop"),
        ("GET", "/clients/f/recover"),
    ]
)


def test_random_json_never_gets_a_500(http: AppClient) -> None:
    http.post("/clients/f/session")

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(route=ROUTES, body=st.dictionaries(FIELDS, JSON_VALUES, max_size=4))
    def check(route: tuple[str, str], body: dict[str, Any]) -> None:
        if "timeout" in body:
            body["timeout"] = 0  # keep a valid take from waiting
        r = http.request(route[0], route[1], json=body)
        assert r.status_code < 500, (route, body, r.text)
        if r.status_code >= 400:
            assert r.json()["error"], r.text

    check()


def test_retried_take_replays_the_reply(http: AppClient, db: homing.Database) -> None:
    """The response to a take can be lost after its commit: retrying it by request id
    gets the same reply back, marked already_taken, and takes nothing twice."""
    http.post("/clients/c/session")
    http.post("/clients/other/session")
    rid = http.post("/clients/c/requests", json={"queue": "orders", "body": {"qty": 1}}).json()[
        "request_id"
    ]
    theirs = http.post("/clients/other/requests", json={"queue": "orders", "body": {"qty": 2}})
    assert http.post("/clients/c/replies/take", json={"request_id": rid}).status_code == 204
    serve(db)
    first = http.post("/clients/c/replies/take", json={"request_id": rid})
    assert first.status_code == 200 and first.json()["already_taken"] is False
    again = http.post("/clients/c/replies/take", json={"request_id": rid})
    assert again.status_code == 200 and again.json()["already_taken"] is True
    assert again.json()["body"] == first.json()["body"] == {"total": 3}
    assert http.post("/clients/c/replies/take").status_code == 204  # nothing else to take
    other = {"request_id": theirs.json()["request_id"]}
    assert http.post("/clients/c/replies/take", json=other).status_code == 404
    unknown = {"request_id": homing.uuid7()}
    assert http.post("/clients/c/replies/take", json=unknown).status_code == 404
    assert http.post("/clients/other/replies/take").json()["body"] == {"total": 6}


# -- authentication: a client reads and acts only as itself -------------------------------------
def test_every_route_needs_the_clients_own_token(http: AppClient, db: homing.Database) -> None:
    assert http.post("/clients/alice/session").status_code == 201
    assert http.post("/clients/bob/session").status_code == 201
    rid = http.post("/clients/alice/requests", json={"queue": "orders", "body": {"qty": 1}})
    rid = rid.json()["request_id"]
    serve(db)
    bob = {"authorization": f"Bearer {client_token(SECRET, 'bob')}"}
    anon = AppClient(create_app(db, secret=SECRET), auth=False)
    routes = [
        ("GET", "/clients/alice/session", None),
        ("POST", "/clients/alice/session", None),
        ("DELETE", "/clients/alice/session", None),
        ("POST", "/clients/alice/requests", {"queue": "orders", "body": 1}),
        ("GET", f"/clients/alice/requests/{rid}", None),
        ("POST", "/clients/alice/prepare", {"queue": "orders", "body": 1}),
        ("POST", "/clients/alice/resubmit", None),
        ("POST", "/clients/alice/drop", None),
        ("GET", "/clients/alice/replies/next", None),
        ("POST", "/clients/alice/replies/take", None),
        ("POST", "/clients/alice/replies/confirm", {"request_ids": [rid]}),
        ("GET", "/clients/alice/recover", None),
    ]
    for headers in ({}, bob, {"authorization": "Bearer nonsense"}, {"authorization": "Basic x"}):
        for method, path, body in routes:
            r = anon.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (headers, method, path, r.text)
            assert "bearer token" in r.json()["error"] and r.headers["www-authenticate"]
    # nothing happened to alice's session: her reply is still there for her
    assert http.post("/clients/alice/replies/take").json()["request_id"] == rid
    # bob with his own token cannot read alice's request either (404, like an unknown id)
    assert http.get(f"/clients/bob/requests/{rid}").status_code == 404


def test_no_secret_means_every_route_refuses(db: homing.Database, monkeypatch: Any) -> None:
    monkeypatch.delenv("HOMING_SESSIONS_SECRET", raising=False)
    closed = AppClient(create_app(db))
    r = closed.post("/clients/c/session")
    assert r.status_code == 401 and "HOMING_SESSIONS_SECRET" in r.json()["error"]
    monkeypatch.setenv("HOMING_SESSIONS_SECRET", SECRET)
    assert AppClient(create_app(db)).post("/clients/c/session").status_code == 201
    assert (
        AppClient(create_app(db, insecure=True), auth=False).get("/clients/c/session").status_code
        == 200
    )
    with pytest.raises(homing.InvalidArgument, match="at least 16 bytes"):
        create_app(db, secret="short")


def test_an_http_client_naming_its_epoch_is_fenced_by_a_newer_open(http: AppClient) -> None:
    first = http.post("/clients/c/session").json()["epoch"]
    second = http.post("/clients/c/session").json()["epoch"]
    assert second == first + 1
    old = {"x-homing-epoch": str(first)}
    r = http.post("/clients/c/requests", json={"queue": "q", "body": 1}, headers=old)
    assert r.status_code == 409 and r.json()["type"] == "SessionFenced"
    new = {"x-homing-epoch": str(second)}
    assert http.post("/clients/c/requests", json={"queue": "q"}, headers=new).status_code == 201
    bad = {"x-homing-epoch": "soon"}
    assert http.get("/clients/c/recover", headers=bad).status_code == 400
