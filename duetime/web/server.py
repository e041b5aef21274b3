"""The console's routes: GET pages render templates from `Console` dicts; POSTs act through
the same transitions as the CLI, after the write checks of `security.Guard`."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import redis
from jinja2 import pass_context
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from duetime.app import App
from duetime.client.schedules import ScheduleNotFound
from duetime.common.errors import (
    DuetimeError,
    InvalidInput,
    InvalidState,
    RedisRefused,
    RedisUnavailable,
    RunNotFound,
)
from duetime.common.models import STATES
from duetime.common.startup import answers
from duetime.common.time.fmt import human_duration as _human
from duetime.common.time.spec import InvalidSchedule
from duetime.ops.admin import VERDICTS
from duetime.ops.inspect import STATE_INDEX, page_runs
from duetime.ops.schedule_listing import SCHEDULE_ORDERS
from duetime.web.console import COUNT_BUDGET, SERIES_WINDOWS, Console
from duetime.web.edges import Edges, HostAllowList
from duetime.web.prefix import UnderPrefix
from duetime.web.security import CSRF_FIELD, SESSION_COOKIE, WRITE_COOKIE, Guard, same_origin

HERE = Path(__file__).resolve().parent
REPLAY_BATCH = 500  # dead letters replayed per confirmed POST; also the most selected at once
MAX_SEARCH = 500  # characters of a search
FLASH = {
    "paused": "Paused: no runs are created until it is resumed.",
    "resumed": "Resumed: occurrences missed while paused follow its catch-up policy.",
    "triggered": "Triggered: a run was created now (id ending in @m<ms>).",
    "replayed": "Replayed: this is the new run.",
    "resolved": "Resolved.",
    "cancelled": "Cancel done or requested.",
    "queue-paused": "Queue paused: its runs are accepted and wait; no worker claims them.",
    "queue-resumed": "Queue resumed: workers claim its runs again.",
    "unlocked": "Writes are unlocked for this browser session.",
    "none-selected": "No dead letter was selected: tick the boxes of those to act on.",
    "locked": "Writes are locked again for this browser session.",
}


def _when(iso: str | None) -> str:
    """`2026-03-29T01:00:00.123Z` → `2026-03-29 01:00:00Z`: one format, UTC, in tables."""
    if not iso:
        return "-"
    return iso.replace("T", " ").split(".")[0].removesuffix("Z").removesuffix("+00:00") + "Z"


async def _pause_or_resume(action: str, form: FormData, pause: Callable[[str], object],
                           resume: Callable[[], object]) -> None:
    """A pause (with the form's note, bounded) or a resume, off the event loop; any other
    action is not a page (404)."""
    if action == "pause":
        await run_in_threadpool(pause, str(form.get("note") or "paused from the web console")[:500])
    elif action == "resume":
        await run_in_threadpool(resume)
    else:
        raise HTTPException(404)


def _seg(name: str) -> str:
    """A run id or schedule name as a URL path (names may hold `?`, `#`, `%`)."""
    return quote(name, safe="@/:")


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def _instant(text: str | None, what: str) -> datetime | None:
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{what}: not an ISO-8601 instant: {text[:60]!r}") from None
    if when.tzinfo is None:
        raise InvalidInput(f"{what}: {text[:60]!r} has no UTC offset; add one (e.g. Z or +01:00)")
    return when


def _ms(when: datetime | None) -> int | None:
    """An instant as `duetime dead purge --before` reads it (common/time/parse.py)."""
    from duetime.common.time.parse import to_ms

    return None if when is None else to_ms(when)


class ConsoleApp:
    def __init__(self, app: App, write_token: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = Console(app)
        self.guard = Guard(write_token, clock)
        self.hosts = HostAllowList()  # create_app sets the one it serves with
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        env = self.templates.env
        env.filters["human"] = _human
        env.filters["when"] = _when
        env.globals["qs"] = self._qs
        env.globals["FLASH"] = FLASH
        env.filters["seg"] = _seg

    @staticmethod
    @pass_context
    def _qs(ctx: Any, **changes: Any) -> str:
        """The current page's query string with some parameters changed (None drops one)."""
        request: Request = ctx["request"]
        params = dict(request.query_params)
        params.pop("flash", None)
        for k, v in changes.items():
            if v is None or v == "":
                params.pop(k, None)
            else:
                params[k] = v
        return "?" + urlencode(params) if params else "?"

    # -- rendering --------------------------------------------------------------------------
    def session(self, request: Request) -> tuple[str, bool]:
        sid = request.cookies.get(SESSION_COOKIE)
        return (sid, False) if sid else (self.guard.new_session(), True)

    def render(self, request: Request, template: str, ctx: dict[str, Any], status: int = 200,
               live: bool = False) -> Response:
        sid, new = self.session(request)
        unlocked = self.guard.unlocked(sid, request.cookies.get(WRITE_COOKIE))
        base = {"where": self.console.where(), "read_only": self.guard.read_only,
                "unlocked": unlocked, "csrf": self.guard.csrf_token(sid), "live": live,
                "flash": FLASH.get(request.query_params.get("flash", "")), "path": request.url.path}
        response = self.templates.TemplateResponse(request, template, {**base, **ctx}, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        if new:
            response.set_cookie(SESSION_COOKIE, sid, httponly=True, samesite="strict")
        return response

    def refuse(self, request: Request, status: int, message: str, advice: str = "") -> Response:
        return self.render(request, "error.html", {"status": status, "message": message,
                                                   "advice": advice}, status=status)

    async def writable(self, request: Request, unlock: bool = False) -> FormData | Response:
        """The form of a write POST, or the refusal: read-only console, another site's page,
        a missing or wrong CSRF token, writes not unlocked in this browser session."""
        if self.guard.read_only:
            return self.refuse(request, 403, "This console is read-only.",
                               "Start it with a write token (`duetime web --write-token ...` or "
                               "DUETIME_WEB_WRITE_TOKEN) to act on runs and schedules.")
        if not same_origin(request.headers.get("origin"), request.headers.get("host"),
                           self.hosts.allows):
            return self.refuse(request, 403, "Refused: the request came from another site's page.")
        form = await request.form()
        sid = request.cookies.get(SESSION_COOKIE)
        sent = form.get(CSRF_FIELD)
        if not self.guard.csrf_ok(sid, sent if isinstance(sent, str) else None):
            return self.refuse(request, 403, "Refused: the form's CSRF token is missing or wrong.",
                               "Reload the page and submit the form again.")
        if not unlock and not self.guard.unlocked(sid, request.cookies.get(WRITE_COOKIE)):
            return self.refuse(request, 403, "Writes are locked in this browser session.",
                               "Unlock them with the write token (the lock at the top right).")
        return form

    # -- probes -----------------------------------------------------------------------------
    # For a platform's health checks (deploy/kubernetes/console.yaml). Not pages: no session,
    # no template, nothing about the namespace in the body. They answer the same allow-listed
    # Host names as every page: a kubelet's probe sends `Host: localhost`.
    def healthz(self, request: Request) -> Response:
        """Alive: the process serves requests (a Redis outage does not make it dead)."""
        return Response("ok\n", media_type="text/plain", headers={"Cache-Control": "no-store"})

    async def readyz(self, request: Request) -> Response:
        """Ready: Redis answers this console's credential (TIME, allowed to every role)."""
        try:
            await run_in_threadpool(answers, self.console.insp.client)
        except redis.RedisError as exc:
            return Response(f"not ready: Redis: {type(exc).__name__}\n", status_code=503,
                            media_type="text/plain", headers={"Cache-Control": "no-store"})
        return Response("ready\n", media_type="text/plain", headers={"Cache-Control": "no-store"})

    # -- pages ------------------------------------------------------------------------------
    def overview(self, request: Request) -> Response:
        window = request.query_params.get("window", "1h")
        if window not in SERIES_WINDOWS:
            raise InvalidInput(f"window must be one of {', '.join(SERIES_WINDOWS)}")
        return self.render(request, "overview.html", self.console.overview(window), live=True)

    def runs(self, request: Request) -> Response:
        f = {k: _param(request, k) for k in ("state", "queue", "task", "schedule", "owner")}
        if f["state"] and f["state"] not in STATE_INDEX:
            raise InvalidInput(f"unknown state {f['state']!r}; one of {', '.join(STATES)}")
        data = self.console.runs(f["state"], f["queue"], f["task"], f["schedule"], f["owner"],
                                 after=_param(request, "after"))
        return self.render(request, "runs.html", {**data, "f": f, "states": STATES,
                                                  "queues": self.console.queues(),
                                                  "first": not _param(request, "after")},
                           live=not _param(request, "after"))

    def run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        show = request.query_params.get("payload") == "1"
        return self.render(request, "run.html", {"run": self.console.run(run_id, show),
                                                 "show_payload": show}, live=True)

    def dead(self, request: Request) -> Response:
        f = {k: _param(request, k) for k in ("queue", "task", "owner")}
        data = self.console.runs("dead", queue=f["queue"], task=f["task"], owner=f["owner"],
                                 after=_param(request, "after"))
        return self.render(request, "dead.html", {**data, "f": f, "owners": self.console.dead_owners(),
                                                  "queues": self.console.queues()}, live=True)

    def dead_replay_confirm(self, request: Request) -> Response:
        f = {k: _param(request, k) for k in ("queue", "task", "owner")}
        count, exact = self.console.count_matching_dead(f["queue"], f["task"], f["owner"])
        return self.render(request, "confirm_replay_all.html", {
            "f": f, "count": count, "exact": exact, "batch": REPLAY_BATCH, "budget": COUNT_BUDGET})

    def _selected(self, ids: list[str]) -> list[dict[str, Any]]:
        """The selected runs that are still dead letters, as the lists show them."""
        from duetime.ops.render import summary_to_dict

        if len(ids) > REPLAY_BATCH:
            raise InvalidInput(f"at most {REPLAY_BATCH} dead letters at once; {len(ids)} selected")
        ids = list(dict.fromkeys(i for i in ids if i))
        return [summary_to_dict(s) for s in self.console.insp._summaries(ids)
                if s is not None and s.state == "dead" and not s.replayed_by]

    async def dead_selected_confirm(self, request: Request) -> Response:
        """The confirmation page of replaying or deleting the dead letters ticked on /dead."""
        action = request.query_params.get("action")
        if action not in ("replay", "delete"):
            raise HTTPException(404)
        ids = request.query_params.getlist("run")
        if not ids:
            return RedirectResponse("/dead?flash=none-selected", status_code=303)
        runs = await run_in_threadpool(self._selected, ids)
        return self.render(request, "confirm_selected.html", {
            "action": action, "runs": runs, "gone": len(set(ids)) - len(runs)})

    async def dead_selected(self, request: Request) -> Response:
        """Replay or delete the selected dead letters (each still dead when it is reached)."""
        form = await self.writable(request)
        if isinstance(form, Response):
            return form
        action = form.get("action")
        ids = [str(v) for v in form.getlist("run")]
        if action not in ("replay", "delete"):
            raise HTTPException(404)
        adm = self.console.admin

        def replay_them() -> list[tuple[str, str]]:
            pairs = []
            for s in self._selected(ids):
                try:
                    pairs.append((s["id"], adm.replay(s["id"])[0]))
                except (InvalidState, RunNotFound):
                    continue  # replayed or purged by someone else meanwhile
            return pairs

        if action == "replay":
            pairs = await run_in_threadpool(replay_them)
            return self.render(request, "replayed.html", {"pairs": pairs, "more": False, "f": {}})
        if len(ids) > REPLAY_BATCH:
            raise InvalidInput(f"at most {REPLAY_BATCH} dead letters at once; {len(ids)} selected")
        deleted = await run_in_threadpool(adm.delete_dead, ids)
        return self.render(request, "purged.html", {"purged": deleted, "asked": len(set(ids)),
                                                    "before": None})

    def dead_purge_confirm(self, request: Request) -> Response:
        before = _instant(_param(request, "before"), "before")
        count = self.console.admin.count_dead(_ms(before))
        return self.render(request, "confirm_purge.html", {"count": count, "before": before})

    async def dead_purge(self, request: Request) -> Response:
        """`duetime dead purge [--before]`: every dead letter (dead at or before an instant)
        deleted for good, records and attempt histories."""
        form = await self.writable(request)
        if isinstance(form, Response):
            return form
        before = _instant(str(form.get("before") or "").strip() or None, "before")
        purged = await run_in_threadpool(self.console.admin.purge_dead, _ms(before))
        return self.render(request, "purged.html", {"purged": purged, "asked": None,
                                                    "before": before})

    async def search(self, request: Request) -> Response:
        """The header's search box: a run id → its page; an idempotency key → its run's page;
        a schedule's name → its page; several → a list; none → a page saying so (404)."""
        text = (_param(request, "q") or "")[:MAX_SEARCH]
        hits = await run_in_threadpool(self.console.search, text) if text else []
        if len(hits) == 1:
            hit = hits[0]
            where = "schedules" if hit["kind"] == "schedule" else "runs"
            return RedirectResponse(f"/{where}/{_seg(hit['target'])}", status_code=303)
        return self.render(request, "search.html", {"q": text, "hits": hits},
                           status=200 if hits or not text else 404)

    def uncertain(self, request: Request) -> Response:
        f = {"queue": _param(request, "queue")}
        data = self.console.runs("uncertain", queue=f["queue"], after=_param(request, "after"))
        return self.render(request, "uncertain.html", {**data, "f": f, "verdicts": VERDICTS,
                                                       "queues": self.console.queues()}, live=True)

    def confirm(self, request: Request) -> Response:
        """The confirmation page of an action on one run (replay, resolve, cancel)."""
        run_id = request.path_params["run_id"]
        action = request.path_params["action"]
        verdict = request.query_params.get("as")
        if action not in ("replay", "resolve", "cancel") or (action == "resolve" and verdict not in VERDICTS):
            raise HTTPException(404)
        return self.render(request, "confirm_run.html", {"run": self.console.run(run_id),
                                                         "action": action, "verdict": verdict})

    def schedules(self, request: Request) -> Response:
        name = _param(request, "name")
        if name:
            self.console.schedules.get(name)  # ScheduleNotFound: a 404 saying so
            return RedirectResponse(f"/schedules/{_seg(name)}", status_code=303)
        order = request.query_params.get("order", "created")
        if order not in SCHEDULE_ORDERS:
            raise InvalidInput(f"order must be one of {', '.join(SCHEDULE_ORDERS)}")
        data = self.console.schedule_page(order, _param(request, "after"))
        return self.render(request, "schedules.html", data)

    def schedule(self, request: Request) -> Response:
        name = request.path_params["name"]
        show = request.query_params.get("payload") == "1"
        until = _instant(_param(request, "until"), "until")
        data = self.console.schedule(name, until, show)
        return self.render(request, "schedule.html", {**data, "show_payload": show},
                           live=until is None)

    def leases(self, request: Request) -> Response:
        return self.render(request, "leases.html", self.console.leases(), live=True)

    def batches(self, request: Request) -> Response:
        return self.render(request, "batches.html", self.console.batches(), live=True)

    def batch(self, request: Request) -> Response:
        return self.render(request, "batch.html", self.console.batch(request.path_params["batch_id"]),
                           live=True)

    def workers(self, request: Request) -> Response:
        gone = request.query_params.get("all") == "1"
        return self.render(request, "workers.html", {**self.console.workers(gone), "all": gone}, live=True)

    def unlock_page(self, request: Request) -> Response:
        return self.render(request, "unlock.html", {})

    # -- actions ----------------------------------------------------------------------------
    async def unlock(self, request: Request) -> Response:
        form = await self.writable(request, unlock=True)
        if isinstance(form, Response):
            return form
        token = form.get("token")
        addr = request.client.host if request.client else ""
        ok, wait = self.guard.check_token(addr, token if isinstance(token, str) else "")
        if not ok and wait > 0:
            seconds = max(1, math.ceil(wait))
            response = self.refuse(
                request, 429, f"Too many wrong write tokens from {addr or 'this address'}: "
                f"the next try is checked in {seconds} s.",
                "Each wrong token after the first few doubles the wait.")
            response.headers["Retry-After"] = str(seconds)
            return response
        if not ok:
            return self.refuse(request, 403, "That is not the write token.")
        sid = request.cookies.get(SESSION_COOKIE) or ""
        response = RedirectResponse("/?flash=unlocked", status_code=303)
        response.set_cookie(WRITE_COOKIE, self.guard.write_cookie(sid), httponly=True, samesite="strict")
        return response

    async def lock(self, request: Request) -> Response:
        form = await self.writable(request, unlock=True)
        if isinstance(form, Response):
            return form
        self.guard.lock(request.cookies.get(SESSION_COOKIE) or "")  # copies of the cookie too
        response = RedirectResponse("/?flash=locked", status_code=303)
        response.delete_cookie(WRITE_COOKIE)
        return response

    async def _action(self, request: Request, target: str) -> tuple[FormData, str, str] | Response:
        """A write action's form, its target (a schedule's name, a run's id) and the action; or
        the response refusing it (see `writable`)."""
        form = await self.writable(request)
        if isinstance(form, Response):
            return form
        return form, request.path_params[target], request.path_params["action"]

    async def schedule_action(self, request: Request) -> Response:
        got = await self._action(request, "name")
        if isinstance(got, Response):
            return got
        form, name, action = got
        schedules = self.console.schedules
        if action == "trigger":
            run_id = await run_in_threadpool(schedules.trigger, name)
            return RedirectResponse(f"/runs/{_seg(run_id)}?flash=triggered", status_code=303)
        await _pause_or_resume(action, form, partial(schedules.set_paused, name, True),
                               partial(schedules.set_paused, name, False))
        return RedirectResponse(f"/schedules/{_seg(name)}?flash={action}d", status_code=303)

    async def queue_action(self, request: Request) -> Response:
        """Pause or resume a queue (duetime/client/pause.py), fleet-wide."""
        from duetime.client.pause import QueuePauses

        got = await self._action(request, "name")
        if isinstance(got, Response):
            return got
        form, name, action = got
        app = self.console.app
        pauses = QueuePauses(self.console.insp.client, app.keys, app.redis_url)
        await _pause_or_resume(action, form, partial(pauses.pause, name),
                               partial(pauses.resume, name))
        return RedirectResponse(f"/?flash=queue-{action}d", status_code=303)

    async def run_action(self, request: Request) -> Response:
        got = await self._action(request, "run_id")
        if isinstance(got, Response):
            return got
        form, run_id, action = got
        adm = self.console.admin
        note = str(form.get("note") or "")[:500]
        if action == "replay":
            new_id, _ = await run_in_threadpool(adm.replay, run_id, form.get("force") == "1", note)
            return RedirectResponse(f"/runs/{_seg(new_id)}?flash=replayed", status_code=303)
        if action == "resolve":
            verdict = str(form.get("verdict") or "")
            result = await run_in_threadpool(adm.resolve, run_id, verdict, note)
            target = result if verdict == "replay" else run_id
            return RedirectResponse(f"/runs/{_seg(target)}?flash=resolved", status_code=303)
        if action == "cancel":
            await run_in_threadpool(adm.cancel, run_id, note or "cancelled from the web console")
            return RedirectResponse(f"/runs/{_seg(run_id)}?flash=cancelled", status_code=303)
        raise HTTPException(404)

    async def dead_replay(self, request: Request) -> Response:
        """Replay the dead letters matching the filters, REPLAY_BATCH per confirmed POST."""
        form = await self.writable(request)
        if isinstance(form, Response):
            return form
        f = {k: (str(form.get(k) or "").strip() or None) for k in ("queue", "task", "owner")}

        def replay_batch() -> tuple[list[tuple[str, str]], bool]:
            page = page_runs(self.console.insp, "dead", f["queue"], f["task"], None, f["owner"],
                             None, REPLAY_BATCH, 20_000)
            pairs = []
            for s in page.runs:
                try:
                    pairs.append((s.id, self.console.admin.replay(s.id)[0]))
                except (InvalidState, RunNotFound):
                    continue  # replayed or purged by someone else meanwhile
            return pairs, page.next is not None

        pairs, more = await run_in_threadpool(replay_batch)
        return self.render(request, "replayed.html", {"pairs": pairs, "more": more, "f": f})


def create_app(app: App, write_token: str | None = None, allowed_hosts: Iterable[str] = (),
               port: int | None = None, clock: Callable[[], float] = time.monotonic) -> Any:
    """The ASGI application of the console for one namespace. It answers to the loopback names
    and `allowed_hosts` only (and, when `port` is given, on that port): see web/edges.py.
    `clock` times the lockouts of wrong write tokens (web/security.py; tests move it).
    It may be mounted under a path of another ASGI app (`host.mount("/ops", create_app(app))`:
    web/prefix.py); the host then guards it (docs/integrations.md)."""
    c = ConsoleApp(app, write_token, clock)

    async def on_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, RunNotFound | ScheduleNotFound):
            return c.refuse(request, 404, str(exc))
        if isinstance(exc, InvalidInput | InvalidSchedule):
            return c.refuse(request, 400, str(exc))
        if isinstance(exc, InvalidState):
            return c.refuse(request, 409, str(exc))
        if isinstance(exc, RedisRefused) and exc.code == "NOPERM":
            return c.refuse(request, 403, str(exc), "The console's Redis user lacks this "
                            "permission: see the console roles in docs/operations.md.")
        if isinstance(exc, RedisUnavailable | redis.ConnectionError | redis.TimeoutError):
            return c.refuse(request, 503, f"Redis is unavailable: {exc}")
        if isinstance(exc, HTTPException):
            return c.refuse(request, exc.status_code, str(exc.detail))
        return c.refuse(request, 500, f"{type(exc).__name__}: {exc}")

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        DuetimeError: on_error, InvalidSchedule: on_error, redis.RedisError: on_error,
        HTTPException: on_error}
    routes = [
        Route("/", c.overview),
        Route("/healthz", c.healthz),
        Route("/readyz", c.readyz),
        Route("/runs", c.runs),
        Route("/runs/{run_id:path}/confirm/{action}", c.confirm),
        Route("/runs/{run_id:path}/{action}", c.run_action, methods=["POST"]),
        Route("/runs/{run_id:path}", c.run),
        Route("/dead", c.dead),
        Route("/dead/replay", c.dead_replay_confirm),
        Route("/dead/replay", c.dead_replay, methods=["POST"]),
        Route("/dead/selected", c.dead_selected_confirm),
        Route("/dead/selected", c.dead_selected, methods=["POST"]),
        Route("/dead/purge", c.dead_purge_confirm),
        Route("/dead/purge", c.dead_purge, methods=["POST"]),
        Route("/search", c.search),
        Route("/uncertain", c.uncertain),
        Route("/schedules", c.schedules),
        Route("/schedules/{name:path}/{action}", c.schedule_action, methods=["POST"]),
        Route("/schedules/{name:path}", c.schedule),
        Route("/queues/{name:path}/{action}", c.queue_action, methods=["POST"]),
        Route("/leases", c.leases),
        Route("/batches", c.batches),
        Route("/batches/{batch_id}", c.batch),
        Route("/workers", c.workers),
        Route("/unlock", c.unlock_page),
        Route("/unlock", c.unlock, methods=["POST"]),
        Route("/lock", c.lock, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    hosts = HostAllowList(allowed_hosts, port)
    c.hosts = hosts
    # mounted under a host app's path (web/prefix.py): its links point under that path
    return Edges(UnderPrefix(Starlette(routes=routes, exception_handlers=handlers)), hosts)
