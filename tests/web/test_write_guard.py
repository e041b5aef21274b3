"""The write token's edges: wrong tokens are throttled per client address (the guard's clock
is moved by the test, never slept through), and `/lock` revokes the write cookie server-side,
so a copy saved before the lock is refused after it."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from duetime.web.security import FREE_TRIES, LOCKOUT_S, WRITE_COOKIE, Guard
from duetime.web.server import create_app
from tests.web.conftest import TOKEN
from tests.web.test_console import csrf_of


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def client_of(wapp, clock: Clock | None = None) -> TestClient:
    app = create_app(wapp, TOKEN, clock=clock or Clock())
    return TestClient(app, base_url="http://127.0.0.1")


def write_cookie(c: TestClient) -> str | None:
    return next((ck.value for ck in c.cookies.jar if ck.name == WRITE_COOKIE), None)


def send_write_cookie(c: TestClient, value: str) -> None:
    """Put a saved copy of the write cookie back in the client's jar (as a replaying attacker
    or a stale tab would send it)."""
    drop_write_cookie(c)
    c.cookies.set(WRITE_COOKIE, value)


def drop_write_cookie(c: TestClient) -> None:
    for ck in list(c.cookies.jar):
        if ck.name == WRITE_COOKIE:
            c.cookies.jar.clear(ck.domain, ck.path, ck.name)


def try_token(c: TestClient, token: str):  # type: ignore[no-untyped-def]
    csrf = csrf_of(c.get("/unlock").text)
    return c.post("/unlock", data={"token": token, "csrf": csrf}, follow_redirects=False)


def test_wrong_tokens_lock_the_address_out_for_a_growing_time(wapp):
    clock = Clock()
    c = client_of(wapp, clock)
    for _ in range(FREE_TRIES - 1):
        res = try_token(c, "wrong-token-0123456789")
        assert res.status_code == 403 and "not the write token" in res.text
    res = try_token(c, "wrong-token-0123456789")  # the last free try starts the lockout
    assert res.status_code == 429 and res.headers["retry-after"] == "1"
    # 300 more guesses in the same instant: none is even compared, the right token neither
    for _ in range(300):
        assert try_token(c, "wrong-token-0123456789").status_code == 429
    res = try_token(c, TOKEN)
    assert res.status_code == 429 and WRITE_COOKIE not in res.cookies
    assert "Too many wrong write tokens" in res.text
    # the lockout passes: a wrong token now earns twice the wait
    clock.t += LOCKOUT_S
    res = try_token(c, "wrong-token-0123456789")
    assert res.status_code == 429 and res.headers["retry-after"] == str(int(2 * LOCKOUT_S))
    clock.t += 2 * LOCKOUT_S - 0.01
    assert try_token(c, TOKEN).status_code == 429  # not yet
    clock.t += 0.01
    res = try_token(c, TOKEN)  # the right token after the lockout works
    assert res.status_code == 303 and res.cookies.get(WRITE_COOKIE)
    # and clears the count: the next wrong token is a free try again
    assert try_token(c, "wrong-token-0123456789").status_code == 403


def test_the_lockout_is_per_address_and_capped():
    clock = Clock()
    g = Guard(TOKEN, clock)
    waits = [g.check_token("10.0.0.1", "nope")[1] for _ in range(FREE_TRIES + 20)]
    assert waits[:FREE_TRIES - 1] == [0.0] * (FREE_TRIES - 1)
    assert waits[FREE_TRIES - 1] == LOCKOUT_S
    assert g.check_token("10.0.0.2", TOKEN) == (True, 0.0)  # another address is not affected
    clock.t += 10_000
    for _ in range(20):  # each failure after a lockout doubles it, up to the cap
        _, wait = g.check_token("10.0.0.1", "nope")
        clock.t += wait
    assert wait == pytest.approx(300.0)


def test_a_write_cookie_saved_before_lock_is_refused_after_it(wapp):
    c = client_of(wapp)
    csrf = csrf_of(c.get("/unlock").text)
    assert try_token(c, TOKEN).status_code == 303
    saved = write_cookie(c)
    assert saved
    page = c.get("/schedules").text
    assert "Writes are locked" not in page
    # an action with the cookie works before the lock (a 404: no such run, past the guard)
    res = c.post("/runs/nope/cancel", data={"csrf": csrf}, follow_redirects=False)
    assert res.status_code == 404, res.text
    assert c.post("/lock", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    assert not write_cookie(c)
    send_write_cookie(c, saved)  # the copy saved before the lock, sent again
    res = c.post("/runs/nope/cancel", data={"csrf": csrf}, follow_redirects=False)
    assert res.status_code == 403 and "Writes are locked" in res.text
    # unlocking again issues a new cookie, which works; the old copy still does not
    drop_write_cookie(c)
    assert try_token(c, TOKEN).status_code == 303
    fresh = write_cookie(c)
    assert fresh and fresh != saved
    assert c.post("/runs/nope/cancel", data={"csrf": csrf}, follow_redirects=False).status_code == 404
    send_write_cookie(c, saved)
    assert c.post("/runs/nope/cancel", data={"csrf": csrf}, follow_redirects=False).status_code == 403
