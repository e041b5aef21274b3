"""The console's batch pages: the list, and one batch with its callbacks and members."""

from __future__ import annotations

from tests.apps import webapp


def test_batch_pages_show_counts_callbacks_and_members(wapp, console):
    bid = wapp.batch([(webapp.charge, [i]) for i in range(3)],
                     on_complete=(webapp.charge, [99]))
    wapp.cancel(wapp.batch_members(bid)[0])
    c = console()
    listing = c.get("/batches")
    assert listing.status_code == 200 and bid in listing.text
    page = c.get(f"/batches/{bid}")
    assert page.status_code == 200
    b = wapp.get_batch(bid)
    assert b.on_complete_run in page.text and "on_complete" in page.text
    assert all(m in page.text for m in wapp.batch_members(bid))
    assert "pending 2" in page.text and "failed 1" in page.text
    assert c.get("/batches/bnope").status_code == 404
