"""duetime in a FastAPI application, as docs/integrations.md shows it, driven through httpx's
ASGI transport: the lifespan opens and closes duetime, a route enqueues with `aenqueue`, the
console is mounted under `/ops` behind the host app's own authentication, its links under
that path."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi import Depends, FastAPI, HTTPException, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

import duetime  # noqa: E402
from duetime.web import create_app  # noqa: E402
from tests.integration.inproc import drain  # noqa: E402

TOKEN = "Bearer ops-secret"


def host_app(dt: duetime.App) -> FastAPI:
    """The application of the how-to: its own auth dependency guards its routes and the
    console."""

    @dt.task(name="fastapi.welcome")
    async def welcome(email: str) -> str:
        return f"welcome, {email}"

    def require_operator(request: Request) -> str:  # the host app's own authentication
        if request.headers.get("authorization") != TOKEN:
            raise HTTPException(status_code=401, detail="not signed in")
        return "alice"

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(dt.store.ready)  # connects, checks the namespace
        yield
        dt.close()

    api = FastAPI(lifespan=lifespan)

    @api.post("/signup")
    async def signup(email: str, user: str = Depends(require_operator)) -> dict[str, str]:
        return {"run_id": await welcome.aenqueue(email)}

    @api.middleware("http")
    async def console_auth(request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path == "/ops" or request.url.path.startswith("/ops/"):
            try:
                require_operator(request)
            except HTTPException as exc:
                return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        return await call_next(request)

    api.mount("/ops", create_app(dt, allowed_hosts=["testserver"]))
    return api


def test_fastapi_lifespan_route_and_the_console_under_its_auth(own_app: duetime.App):
    api = host_app(own_app)
    auth = {"authorization": TOKEN}

    async def main() -> None:
        async with api.router.lifespan_context(api):
            assert own_app._store is not None  # opened by the lifespan
            transport = httpx.ASGITransport(app=api)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
                assert (await c.post("/signup", params={"email": "a@b.c"})).status_code == 401
                got = await c.post("/signup", params={"email": "a@b.c"}, headers=auth)
                assert got.status_code == 200, got.text
                run_id = got.json()["run_id"]
                await drain(own_app)
                assert await own_app.await_result(run_id, 30) == "welcome, a@b.c"

                # the console: behind the host's authentication
                for path in ("/ops/", f"/ops/runs/{run_id}", "/ops/static/console.css"):
                    assert (await c.get(path)).status_code == 401, path
                page = await c.get(f"/ops/runs/{run_id}", headers=auth)
                assert page.status_code == 200 and run_id in page.text
                assert "succeeded" in page.text
                # its own links point under the mount: none leaves it
                links = re.findall(r'(?:href|action|src)="(/[^"]*)"', page.text)
                assert links and all(x.startswith("/ops/") for x in links), links
                css = re.search(r'href="(/ops/static/[^"]+)"', page.text)
                assert css and (await c.get(css.group(1), headers=auth)).status_code == 200
                overview = await c.get("/ops/", headers=auth)
                assert overview.status_code == 200
                assert 'href="/runs' not in overview.text and 'href="/ops/runs' in overview.text
        assert own_app._store is None  # closed by the lifespan

    asyncio.run(main())


def test_the_console_alone_is_unchanged(own_app: duetime.App):
    """Not mounted (`duetime web`): no root path, links as they were."""
    console = create_app(own_app, allowed_hosts=["testserver"])

    async def main() -> str:
        transport = httpx.ASGITransport(app=console)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            page = await c.get("/")
            assert page.status_code == 200
            return page.text

    text = asyncio.run(main())
    assert 'href="/static/' in text and "/ops" not in text
    own_app.close()


def test_the_mounted_consoles_redirects_and_cookies_stay_under_its_path(own_app: duetime.App):
    """A write-enabled console mounted under /ops: unlocking redirects to /ops/ and its
    cookies are the mount's (the host app's other paths never receive them)."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/ops", create_app(own_app, write_token="w" * 20,
                                                      allowed_hosts=["testserver"]))])

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=host)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            form = await c.get("/ops/unlock")
            assert 'action="/ops/unlock"' in form.text
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf
            return await c.post("/ops/unlock", data={"token": "w" * 20, "csrf": csrf.group(1)})

    done = asyncio.run(main())
    assert done.status_code == 303 and done.headers["location"] == "/ops/?flash=unlocked"
    cookies = done.headers.get_list("set-cookie")
    assert cookies and all("Path=/ops" in c for c in cookies), cookies
    own_app.close()
