"""Every command says what it does and every option says what it means: `--help` is the
manual an on-call engineer reads first."""

from __future__ import annotations

from collections.abc import Iterator

import click

from duetime.cli import main


def _commands(cmd: click.Command, path: tuple[str, ...]) -> Iterator[tuple[str, click.Command]]:
    yield " ".join(path), cmd
    if isinstance(cmd, click.Group):  # through the group's own lookup: subcommands load lazily
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from _commands(sub, (*path, name))


def test_every_command_has_a_description_and_every_option_help_text():
    commands = list(_commands(main, ("duetime",)))
    assert len(commands) > 20  # the walk reaches the nested groups
    undescribed = [path for path, cmd in commands if not (cmd.help or cmd.short_help)]
    unexplained = [f"{path} {p.opts[0]}" for path, cmd in commands for p in cmd.params
                   if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert undescribed == []
    assert unexplained == []
