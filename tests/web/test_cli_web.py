"""`duetime web` on the command line: bad input is one `error:` line, nothing starts."""

from __future__ import annotations

import httpx

from tests.integration.opkit import cli, one_line_error


def test_a_short_write_token_is_refused(url, namespace):
    err = one_line_error(cli(url, namespace, "web", "--write-token", "short"), 2)
    assert "--write-token" in err and "16 characters" in err


def test_it_binds_loopback_and_says_what_it_shows(web, namespace):
    from duetime.cli.web import web as command

    assert {p.name: p.default for p in command.params}["host"] == "127.0.0.1"
    base = web()  # no --host
    assert base.startswith("http://127.0.0.1:")
    page = httpx.get(base + "/").text
    assert namespace in page and "read-only" in page
