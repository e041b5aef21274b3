"""The ACL roles as docs/operations.md documents them: the test runs exactly those lines, so
the documentation cannot drift from what works."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import redis

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
LINE = re.compile(r"^ACL SETUSER (duetime-[a-z-]+) (.+)$", re.M)
ROLE_OF = {"duetime-worker": "worker", "duetime-scheduler": "scheduler",
           "duetime-operator-ro": "operator-ro", "duetime-operator": "operator",
           "duetime-console": "console", "duetime-console-write": "console-write"}


@dataclass(frozen=True)
class Role:
    name: str  # worker | scheduler | operator-ro | operator | console | console-write
    user: str  # made unique per test: ACL users are server-wide
    password: str
    rules: list[str]

    def url(self, port: int, scheme: str = "redis") -> str:
        return f"{scheme}://{self.user}:{self.password}@127.0.0.1:{port}/0"

    @property
    def commands(self) -> set[str]:
        return {r[1:] for r in self.rules if r.startswith("+")}


def documented() -> dict[str, list[str]]:
    """Role -> the rules of its `ACL SETUSER` line in docs/operations.md."""
    found = {ROLE_OF[user]: rules.split() for user, rules in LINE.findall(DOCS.read_text())}
    assert set(found) == set(ROLE_OF.values()), f"docs/operations.md lacks roles: {found.keys()}"
    return found


def roles(namespace: str, tag: str) -> dict[str, Role]:
    """The documented roles for `namespace`, as users named `<user>-<tag>`."""
    out = {}
    for name, rules in documented().items():
        password = f"pw-{name}-{tag}"
        mine = [r.replace("duetime:", f"{namespace}:") for r in rules]
        mine = [f">{password}" if r.startswith(">") else r for r in mine]
        user = f"duetime-{name}-{tag}"
        out[name] = Role(name, user, password, mine)
    return out


def install(client: redis.Redis, rs: dict[str, Role]) -> None:
    """Redis before 7.2 has no CLIENT SETINFO: its rule is dropped there (docs say so)."""
    info = client.info("server")
    old = "valkey_version" not in info and tuple(
        int(x) for x in str(info["redis_version"]).split(".")[:2]) < (7, 2)
    for r in rs.values():
        rules = [x for x in r.rules if not (old and x == "+client|setinfo")]
        client.execute_command("ACL", "SETUSER", r.user, *rules)


def remove(client: redis.Redis, rs: dict[str, Role]) -> None:
    client.execute_command("ACL", "DELUSER", *(r.user for r in rs.values()))


def refusals(client: redis.Redis, rs: dict[str, Role]) -> list[dict]:
    """ACL LOG entries of these users (denied commands, keys or channels)."""
    users = {r.user for r in rs.values()}
    out = []
    for e in client.acl_log(count=1000):
        if e.get("username") in users:
            out.append({k: e.get(k) for k in ("username", "reason", "context", "object", "count")})
    return out
