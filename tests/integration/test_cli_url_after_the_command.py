"""``--url`` after the command means what it means before it, for every command."""

from __future__ import annotations

import argparse
import json

from sqlqueue_orm import cli
from sqlqueue_orm.cli import arguments
from tests.conftest import only
from tests.integration.cli_process import sqlqueue


@only("sqlite", "postgresql")
def test_url_after_the_command_is_the_database(database, tmp_path):
    assert sqlqueue("create-queue", "orders", "--url", database.url, cwd=tmp_path).returncode == 0
    sent = sqlqueue("send", "orders", "--body", "x", "--url", database.url, cwd=tmp_path)
    assert sent.returncode == 0, sent.stderr
    listed = sqlqueue("list-queues", "--url", database.url, cwd=tmp_path)
    assert listed.stdout.splitlines() == ["orders\t1"], listed.stderr
    # a command of a group, and the group's name before its command
    assert sqlqueue("delayed", "list", "--url", database.url, cwd=tmp_path).returncode == 0
    assert sqlqueue("errors", "--url", database.url, "list", "--queue", "orders",
                    "--json", cwd=tmp_path).returncode == 0
    assert not (tmp_path / "sqlqueue.db").exists()  # nothing fell back to the default


@only("sqlite")
def test_url_after_the_command_wins_over_the_environment_and_the_one_before(database, tmp_path):
    other = f"sqlite:///{tmp_path / 'other.db'}"
    database.transport().create_queue("here")
    result = sqlqueue("--url", other, "list-queues", "--json", "--url", database.url,
                      cwd=tmp_path, env_url=other)
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"queue": "here", "count": 0}
    ]
    # Given only before the command, it is kept (the command's own --url is absent, not None).
    before = sqlqueue("--url", database.url, "list-queues", cwd=tmp_path, env_url=other)
    assert before.stdout.splitlines() == ["here\t0"]


def test_every_command_has_url_with_the_same_help(tmp_path):
    help_text = sqlqueue("outbox", "dispatch", "--help", cwd=tmp_path).stdout
    assert "--url URL" in help_text and "$SQLQUEUE_URL" in " ".join(help_text.split())
    commands = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    commands.append(((*path, name), sub))
                    walk(sub, (*path, name))

    walk(cli.build_parser(), ())
    assert len(commands) > 20
    for path, parser in commands:
        [url] = [action for action in parser._actions if "--url" in action.option_strings]
        assert url.help == arguments.URL_HELP, path
        assert url.default is argparse.SUPPRESS, path
