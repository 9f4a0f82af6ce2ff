"""The ``sqlqueue`` parser is built, and every ``--help`` printed, without SQLAlchemy.

Each command imports the library modules it needs when it runs, so a command starts without
loading SQLAlchemy, the dialects and the receiving side first. Checked structurally (which
modules a fresh interpreter holds), not by a clock: the time it saves is measured by the
``cli-start`` cell of ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from sqlqueue_orm import Transport, config, dialects
from sqlqueue_orm.recoverability import groups

#: Imports the command line, prints every help page, and reports which modules were loaded.
_PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from sqlqueue_orm import cli

    parser = cli.build_parser()
    pages = [["--help"]]
    for action in parser._subparsers._group_actions:
        for name, command in action.choices.items():
            pages.append([name, "--help"])
            for sub in command._subparsers._group_actions if command._subparsers else []:
                pages.extend([name, each, "--help"] for each in sub.choices)
    for argv in pages:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            cli.main(argv)
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "sqlalchemy")
    print(json.dumps({"pages": len(pages), "sqlalchemy": loaded}))
    """
)


def test_every_help_page_is_printed_without_importing_sqlalchemy():
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["pages"] > 20  # the top level, each command and each sub-command
    assert report["sqlalchemy"] == []


def test_peek_loads_the_transport_and_not_the_endpoint_side(tmp_path):
    url = f"sqlite:///{tmp_path / 'queues.db'}"
    with Transport(url) as transport:
        transport.create_queue("billing")
    probe = textwrap.dedent(
        f"""
        import json, sys
        from sqlqueue_orm.cli import main
        status = main(["--url", {url!r}, "peek", "billing"])
        loaded = sorted(name for name in sys.modules if name.startswith("sqlqueue_orm."))
        print(json.dumps({{"status": status, "loaded": loaded}}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["status"] == 0
    assert "sqlqueue_orm.transport" in report["loaded"]
    unneeded = ("receiving", "sending", "recoverability", "health", "control", "migration")
    assert [
        name for name in report["loaded"] if name.split(".")[1] in unneeded
    ] == []


def test_the_package_imports_its_public_names_on_first_use():
    probe = (
        "import sys, sqlqueue_orm\n"
        "before = 'sqlalchemy' in sys.modules\n"
        "from sqlqueue_orm import Transport, Endpoint, queue_model\n"
        "print(before, Transport.__module__, Endpoint.__module__, 'sqlalchemy' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == [
        "False", "sqlqueue_orm.transport", "sqlqueue_orm.receiving.endpoint", "True"
    ]


def test_the_values_the_parser_shows_are_the_librarys_own():
    assert sorted(dialects.ALL) == sorted(config.DIALECT_NAMES)
    assert list(groups.GROUPINGS) == list(config.FAILURE_GROUPINGS)
