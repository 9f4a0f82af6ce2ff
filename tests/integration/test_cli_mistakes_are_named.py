"""A mistyped option, command or URL is named in one line (exit status 2), with the close match.

These refusals read only the arguments: nothing reaches a database, so they run once, with no
database (the default SQLite file is checked not to appear).
"""

from __future__ import annotations

from tests.integration.cli_process import one_line, sqlqueue


def test_a_mistyped_option_is_named_with_the_close_match(tmp_path):
    # --body or --body-file is required too: the unknown option is what the user must hear of
    result = sqlqueue("send", "billing", "--bdy", "x", cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "unknown option '--bdy'; did you mean '--body'?" in line, line
    assert line.startswith("sqlqueue send: error: ")
    # alone (nothing else is wrong), as OPTION=VALUE, and after the command's own options
    for args, typed, meant in [
        (("list-queues", "--jsno"), "--jsno", "--json"),
        (("send", "billing", "--body", "x", "--hedaer=a=b"), "--hedaer", "--header"),
        (("errors", "list", "--exeption-type", "E"), "--exeption-type", "--exception-type"),
    ]:
        result = sqlqueue(*args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert f"unknown option {typed!r}; did you mean {meant!r}?" in one_line(result.stderr)
    assert not (tmp_path / "sqlqueue.db").exists()


def test_an_unknown_option_without_a_close_match_is_named_alone(tmp_path):
    result = sqlqueue("peek", "billing", "--frobnicate", cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "unknown option '--frobnicate'" in line and "did you mean" not in line, line


def test_a_mistyped_command_is_named_with_the_close_match(tmp_path):
    result = sqlqueue("sedn", "billing", "--body", "x", cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "unknown command 'sedn'; did you mean 'send'?" in line, line
    assert "choose from" not in line  # the close match, not the list of twenty
    nested = sqlqueue("errors", "shwo", "x", cwd=tmp_path)
    assert nested.returncode == 2
    assert "unknown command 'shwo'; did you mean 'show'?" in one_line(nested.stderr)
    assert not (tmp_path / "sqlqueue.db").exists()


def test_a_value_that_is_no_url_is_echoed_as_given(tmp_path):
    result = sqlqueue("--url", "not a url", "peek", "billing", cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "cannot use database URL 'not a url':" in line, line
    # one that looks like a URL with a password: the password is masked, the rest as given
    typed = "postgresql://scott:tiger@db.example:notaport/billing"
    result = sqlqueue("--url", typed, "peek", "billing", cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "'postgresql://scott:***@db.example:notaport/billing'" in line, line
    assert "tiger" not in line
