"""The dashboard over HTTP (a real uvicorn server in a thread) on SQLite, PostgreSQL and a
sharded store: pages, filters, keyset pages, actions with CSRF, read-only, auth, access."""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner

import homing
from homing.cli import cli
from homing.dashboard import Access
from homing.dashboard.server import BackgroundDashboard


@pytest.fixture
def served(jobs: homing.JobAPI) -> Iterator[tuple[homing.JobAPI, httpx.Client]]:
    dash = BackgroundDashboard(jobs).start()
    with httpx.Client(base_url=dash.url.rstrip("/"), timeout=30, follow_redirects=True) as client:
        yield jobs, client
    dash.stop()


def _csrf(client: httpx.Client, path: str) -> str:
    """The token the forms carry: the page's hidden field when it has a form, else the
    cookie that every page sets (the two are the same: double submit)."""
    page = client.get(path)
    assert page.status_code == 200
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    cookie = client.cookies.get("homing_csrf")
    assert cookie and (token is None or token.group(1) == cookie)
    return cookie


def _failed_job(db: homing.JobAPI, type_: str = "email", args: object = None) -> str:
    handle = db.insert(type_, args if args is not None else {"user": 1})
    job = db.grab([type_], lock_for=30, where=None)
    assert job is not None and job.handle == handle
    db.perm_fail(job, "smtp said no")
    return handle


def test_pages_show_types_filters_and_the_job(served: tuple[homing.JobAPI, httpx.Client]) -> None:
    db, client = served
    failed = _failed_job(db, "email", {"user": 7})
    db.insert("sms", {"user": 8})
    overview = client.get("/")
    assert overview.status_code == 200
    assert 'data-type="email"' in overview.text and 'data-type="sms"' in overview.text
    assert '<svg id="chart"' in overview.text
    assert client.get("/", headers={"X-Homing-Fragment": "1"}).text.lstrip().startswith("<h1>")

    listed = client.get("/jobs", params={"state": "failed"})
    assert failed in listed.text and "sms" not in listed.text.split("<tbody>")[1]
    by_args = client.get("/jobs", params={"where": '{"user": 8}'})
    assert ">sms<" in by_args.text and failed not in by_args.text
    assert ">sms<" not in client.get("/jobs", params={"where": '{"user": {"$gte": 9}}'}).text

    page = client.get(f"/jobs/{failed}")
    assert page.status_code == 200
    text = html.unescape(page.text)
    assert "smtp said no" in text and '"user": 7' in text and 'id="redrive"' in text


def test_the_overview_lists_the_workers_and_the_jobs_they_hold(
    served: tuple[homing.JobAPI, httpx.Client],
) -> None:
    db, client = served
    assert "no worker grabbed" in client.get("/").text
    db.insert("email", {"user": 1})
    job = db.grab(["email"], lock_for=60, worker_id="mail-worker-<3>")
    assert job is not None
    table = client.get("/").text.split('<table id="workers">')[1].split("</table>")[0]
    row = next(r for r in table.split("<tr>") if "mail-worker-&lt;3&gt;" in r)  # escaped
    assert '<td class="num">1</td>' in row  # it holds one job
    db.complete(job)
    table = client.get("/").text.split('<table id="workers">')[1].split("</table>")[0]
    assert "mail-worker-&lt;3&gt;" in table and '<td class="num">0</td>' in table


@pytest.mark.parametrize(
    "where",
    ['{"user": {"$where": "1=1"}}', "{'user': 1}", '{"a; DROP TABLE homing_jobs": 1}', "[1]"],
)
def test_bad_args_search_is_a_400_not_a_500(
    served: tuple[homing.JobAPI, httpx.Client], where: str
) -> None:
    db, client = served
    db.insert("email", {"user": 1})
    response = client.get("/jobs", params={"where": where})
    assert response.status_code == 400
    assert 'id="error"' in response.text
    assert client.get("/jobs").status_code == 200  # the table is still there


def test_unknown_job_and_bad_cursor_are_clear(served: tuple[homing.JobAPI, httpx.Client]) -> None:
    _db, client = served
    assert client.get("/jobs/not-a-job").status_code == 404
    assert client.get("/jobs/9:01a2").status_code == 404
    assert client.get("/jobs", params={"cursor": "x;1"}).status_code == 400


def test_actions_on_a_handle_that_names_no_job_are_404s(
    served: tuple[homing.JobAPI, httpx.Client],
) -> None:
    """A malformed id reaches no SQL (PostgreSQL's uuid column would refuse it as a 500)."""
    db, client = served
    handle = _failed_job(db)
    token = _csrf(client, f"/jobs/{handle}")
    for bad in ("not-a-job", "01a2", "x" * 36):
        for action in ("perm_fail", "delete", "redrive", "cancel"):
            response = client.post(f"/jobs/{bad}/{action}", data={"csrf": token})
            assert response.status_code == 404, (bad, action, response.status_code)
    upper = client.post(f"/jobs/{handle.upper()}/delete", data={"csrf": token})
    assert upper.status_code == 200  # a UUID in capitals names the same job
    with pytest.raises(homing.JobNotFound):
        db.details(handle)


def test_keyset_pages_list_every_job_once(served: tuple[homing.JobAPI, httpx.Client]) -> None:
    db, client = served
    inserted = set(db.insert_many([("bulk", {"i": i}) for i in range(123)]))
    seen: list[str] = []
    url: str | None = "/jobs?type=bulk"
    while url:
        page = client.get(url)
        assert page.status_code == 200
        seen += re.findall(r'href="/jobs/([^"?]+)" class="job-link"', page.text)
        nxt = re.search(r'id="next" href="([^"]+)"', page.text)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
    assert len(seen) == len(inserted) and set(seen) == inserted


def test_actions_need_the_csrf_token_and_change_the_store(
    served: tuple[homing.JobAPI, httpx.Client], caplog: pytest.LogCaptureFixture
) -> None:
    db, client = served
    handle = _failed_job(db)
    assert client.post(f"/jobs/{handle}/redrive").status_code == 403
    assert client.post(f"/jobs/{handle}/redrive", data={"csrf": "x" * 43}).status_code == 403
    assert db.details(handle).state == "failed"

    token = _csrf(client, f"/jobs/{handle}")
    with caplog.at_level(logging.INFO, logger="homing.dashboard.audit"):
        done = client.post(f"/jobs/{handle}/redrive", data={"csrf": token})
    assert done.status_code == 200 and "redrive: job" in done.text  # after the 303
    assert db.details(handle).state == "ready"
    assert any(
        "action=redrive" in r.getMessage() and handle in r.getMessage() for r in caplog.records
    )

    again = client.post(f"/jobs/{handle}/redrive", data={"csrf": token})
    assert again.status_code == 400 and "only perm-failed" in again.text

    assert client.post(f"/jobs/{handle}/perm_fail", data={"csrf": token}).status_code == 200
    details = db.details(handle)
    assert details.state == "failed" and "dashboard" in (details.last_error or "")
    assert client.post(f"/jobs/{handle}/delete", data={"csrf": token}).status_code == 200
    with pytest.raises(homing.JobNotFound):
        db.details(handle)
    assert client.post(f"/jobs/{handle}/explode", data={"csrf": token}).status_code == 404


def test_cancel_from_the_dashboard(served: tuple[homing.JobAPI, httpx.Client]) -> None:
    """Cancel (issue 16) from the job page: a ready job never runs, a running one's
    completion is refused; both show as cancelled."""
    db, client = served
    ready = db.insert("email", {"n": 1})
    token = _csrf(client, f"/jobs/{ready}")
    assert client.post(f"/jobs/{ready}/cancel").status_code == 403  # no CSRF token
    assert db.details(ready).state == "ready"
    assert client.post(f"/jobs/{ready}/cancel", data={"csrf": token}).status_code == 200
    assert db.details(ready).state == "cancelled"
    assert db.grab(["email"], lock_for=60) is None

    running = db.insert("email", {"n": 2})
    job = db.grab(["email"], lock_for=60)
    assert job is not None and job.handle == running
    assert client.post(f"/jobs/{running}/cancel", data={"csrf": token}).status_code == 200
    with pytest.raises(homing.JobCancelled):
        db.complete(job)
    assert db.details(running).state == "cancelled"
    assert "cancelled" in client.get("/").text


def test_a_running_job_is_left_to_its_holder(served: tuple[homing.JobAPI, httpx.Client]) -> None:
    db, client = served
    handle = db.insert("email", {})
    job = db.grab(["email"], lock_for=60)
    assert job is not None
    token = _csrf(client, "/")
    for action in ("perm_fail", "delete", "redrive"):
        assert client.post(f"/jobs/{handle}/{action}", data={"csrf": token}).status_code == 400
    db.complete(job)  # the holder's lease still works
    assert db.details(handle).state == "done"


def test_bulk_redrive_confirms_then_redrives_the_filtered_set(
    served: tuple[homing.JobAPI, httpx.Client],
) -> None:
    db, client = served
    mine = [_failed_job(db, "email", {"batch": "a"}) for _ in range(3)]
    other = _failed_job(db, "email", {"batch": "b"})
    query = {"type": "email", "state": "failed", "where": '{"batch": "a"}'}
    confirm = client.get("/bulk/redrive", params=query)
    assert confirm.status_code == 200 and re.search(r'id="count">\s*3 job', confirm.text)
    token = _csrf(client, "/")
    unconfirmed = client.post("/bulk/redrive", data={**query, "csrf": token})
    assert unconfirmed.status_code == 400
    assert all(db.details(h).state == "failed" for h in mine)
    done = client.post("/bulk/redrive", data={**query, "csrf": token, "confirm": "yes"})
    assert done.status_code == 200 and "3 jobs redriven" in done.text
    assert all(db.details(h).state == "ready" for h in mine)
    assert db.details(other).state == "failed"


def test_engine_graph_draws_queues_and_selectors(store_url: str) -> None:
    def q(*args: str) -> None:
        result = CliRunner().invoke(cli, ["--db", store_url, "queues", *args])
        assert result.exit_code == 0, result.output

    q("create", "orders", "--dead-letter", "$dead")
    q("create", "billing")
    q("bind", "orders", "to-billing", "--to", "billing", "--credits", "5")
    q("bind", "billing", "printer", "--consumer", "p-1", "--credits", "2")
    q("publish", "orders", '{"n": 1}')
    with homing.connect(store_url) as db:
        dash = BackgroundDashboard(db).start()
        try:
            page = httpx.get(dash.url + "engine", timeout=30)
        finally:
            dash.stop()
    assert page.status_code == 200
    assert '<svg id="graph"' in page.text
    for name in ('data-key="orders"', 'data-key="billing"', 'data-key="$dead"', "to-billing"):
        assert name in page.text
    assert re.search(r"printer · move · credits \d+/\d+", page.text)


def test_read_only_and_authentication(store_url: str) -> None:
    with homing.connect(store_url) as db:
        handle = _failed_job(db)
        access = Access(token="t" * 20, basic=("admin", "correct-horse"), read_only=True)
        dash = BackgroundDashboard(db, access=access).start()
        try:
            base = dash.url.rstrip("/")
            assert httpx.get(base + "/").status_code == 401
            assert httpx.get(base + "/", auth=("admin", "wrong-horse")).status_code == 401
            with httpx.Client(
                base_url=base, auth=("admin", "correct-horse"), follow_redirects=True
            ) as client:
                page = client.get(f"/jobs/{handle}")
                assert page.status_code == 200 and 'id="redrive"' not in page.text
                token = client.cookies.get("homing_csrf")
                refused = client.post(f"/jobs/{handle}/redrive", data={"csrf": token})
                assert refused.status_code == 403 and "read-only" in refused.text
            bearer = {"Authorization": "Bearer " + "t" * 20}
            assert httpx.get(base + "/metrics", headers=bearer).status_code == 200
        finally:
            dash.stop()
        assert db.details(handle).state == "failed"


def test_cli_refuses_the_network_without_auth(store_url: str) -> None:
    result = CliRunner().invoke(cli, ["--db", store_url, "dashboard", "--host", "0.0.0.0"])
    assert result.exit_code != 0
    assert "without authentication" in result.output
    short = CliRunner().invoke(cli, ["--db", store_url, "dashboard", "--token", "short"])
    assert short.exit_code != 0 and "16 characters" in short.output


def test_args_search_scans_bounded_windows_and_still_finds_every_match(
    served: tuple[homing.JobAPI, httpx.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    from homing.dashboard import views

    monkeypatch.setattr(views, "SCAN_WINDOW", 7)
    db, client = served
    handles = db.insert_many([("scan", {"hit": i % 5 == 0, "i": i}) for i in range(60)])
    wanted = {h for i, h in enumerate(handles) if i % 5 == 0}
    seen: list[str] = []
    url: str | None = "/jobs?where=" + '{"hit": true}'
    pages = 0
    while url:
        page = client.get(url)
        assert page.status_code == 200 and 'id="window"' in page.text
        seen += re.findall(r'href="/jobs/([^"?]+)" class="job-link"', page.text)
        nxt = re.search(r'id="next" href="([^"]+)"', page.text)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
        pages += 1
        assert pages < 100
    assert len(seen) == len(wanted) and set(seen) == wanted


def test_job_page_links_parent_and_children(served: tuple[homing.JobAPI, httpx.Client]) -> None:
    db, client = served
    parent = db.insert("FiredEvent", {"event": 1})
    job = db.grab(["FiredEvent"], lock_for=30)
    assert job is not None
    children = db.replace(job, [("ProcessSubscription", {"n": n}) for n in range(3)])
    page = client.get(f"/jobs/{parent}")
    assert page.status_code == 200 and 'id="find-children"' in page.text
    found = client.get(f"/jobs/{parent}", params={"children": "1"})
    assert all(c in found.text for c in children)
    child = client.get(f"/jobs/{children[0]}")
    assert f'href="/jobs/{parent}"' in child.text


def test_http_sessions_and_messenger_pages(store_url: str) -> None:
    from homing.http import Sender
    from homing.sessions import Sessions
    from homing.store import messenger_queries as mq

    with homing.connect(store_url) as db:
        sender = Sender(db, dispatch=False)
        try:
            sender.enqueue("send", "http://receiver.example/orders", {"order": 1})
            sender.enqueue("send", "http://receiver.example/orders", {"order": 2})
        finally:
            sender.close()
        session = Sessions(db).open("client-7")
        session.enqueue(session.prepare("billing", {"amount": 3}))
        session.prepare("billing", {"amount": 4})  # A: prepared, not enqueued
        with db.store.transaction() as tx:
            mq.insert_dead(
                tx,
                "node-a",
                mq.DeadRow(
                    "out",
                    "peer-b",
                    "ch-1",
                    42,
                    1,
                    2,
                    b"{}",
                    "gave up after 5 attempts",
                    5,
                    1_800_000_000.0,
                    "on_order",
                    ("dealer", "tcp://peer-b:5555", "peer-b"),
                ),
            )
        dash = BackgroundDashboard(db).start()
        try:
            with httpx.Client(base_url=dash.url.rstrip("/"), timeout=30) as client:
                http_page = client.get("/http")
                sessions_page = client.get("/sessions")
                messenger_page = client.get("/messenger")
                metrics = client.get("/metrics").text
        finally:
            dash.stop()
    assert http_page.status_code == 200
    row = re.search(
        r"<td>http://receiver.example/orders</td>((?:<td[^>]*>[^<]*</td>)+)", http_page.text
    )
    assert row
    cells = re.findall(r'<td class="num">([^<]*)</td>', row.group(1))
    assert cells[0] == "2" and cells[1] == "0"  # pending, of which retrying
    assert sessions_page.status_code == 200
    client_row = re.search(r"<td>client-7</td>(.*?)</tr>", sessions_page.text, re.S)
    assert client_row
    counts = re.findall(r'<td class="num">(\d+)</td>', client_row.group(1))
    assert counts == ["1", "1", "1", "0", "0"]  # connects, then A B C D
    assert messenger_page.status_code == 200
    assert "gave up after 5 attempts" in messenger_page.text and "peer-b" in messenger_page.text
    assert 'homing_http_outbox_pending{destination="http://receiver.example/orders"} 2.0' in metrics
    assert 'homing_http_outbox_lag_seconds{destination="http://receiver.example/orders"}' in metrics
    assert 'homing_messenger_dead_letters{owner="node-a"} 1.0' in metrics


def test_overview_counts_by_state_with_a_manual_clock(
    jobs: homing.JobAPI, clock: homing.ManualClock
) -> None:
    from homing.dashboard import views

    t0 = clock.now()
    jobs.insert("a", {"n": 1})
    jobs.insert("a", {"n": 2}, run_at=t0 + 100)
    jobs.insert_many([("b", {"n": i}) for i in range(3)])
    first, second = (jobs.grab(["b"], lock_for=30) for _ in range(2))
    assert first is not None and second is not None
    jobs.complete(first)
    jobs.insert("c", {})
    doomed = jobs.grab(["c"], lock_for=30)
    assert doomed is not None
    jobs.perm_fail(doomed, "no")
    clock.advance(60)  # the second b's lease (30 s) has run out

    data = views.overview(views.Source(jobs))  # type: ignore[arg-type]
    rows = {r["type"]: r for r in data["types"]}
    assert (rows["a"]["ready"], rows["a"]["scheduled"]) == (1, 1)
    assert rows["a"]["oldest_ready_age_s"] == pytest.approx(60, abs=1)
    assert (rows["b"]["ready"], rows["b"]["running"], rows["b"]["expired"]) == (1, 0, 1)
    assert rows["b"]["done_window"] == 1 and rows["b"]["per_min"] == pytest.approx(0.2)
    assert rows["c"]["failed"] == 1 and rows["a"]["failed"] == 0
    assert data["expired"] == 1
    assert (data["chart"]["total"], data["chart"]["failed"]) == (1, 1)


def test_a_crafted_flash_message_is_not_shown(served: tuple[homing.JobAPI, httpx.Client]) -> None:
    _db, client = served
    page = client.get("/", params={"msg": "Your session expired: log in at https://evil.example"})
    assert page.status_code == 200 and 'id="msg"' not in page.text
    ours = client.get("/", params={"msg": "redrive: job 0:01a2-b3 done"})
    assert 'id="msg"' in ours.text
