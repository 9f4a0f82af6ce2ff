"""Bounded network waits: the parameters each dialect's engines connect with, the caller's kept."""

from __future__ import annotations

import sqlalchemy as sa

from sqlqueue_orm import dialects


def test_postgresql_connections_bound_every_wait_on_the_network():
    support = dialects.for_url("postgresql")
    args = support.connect_args(sa.make_url("postgresql+psycopg://u@h/d"), {})
    assert args == {
        "connect_timeout": 5,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 10_000,
    }


def test_what_the_url_or_connect_args_set_is_kept():
    support = dialects.for_url("postgresql")
    url = sa.make_url("postgresql+psycopg://u@h/d?tcp_user_timeout=60000&keepalives=0")
    args = support.connect_args(url, {"connect_timeout": 30, "application_name": "mine"})
    assert args["connect_timeout"] == 30
    assert args["application_name"] == "mine"
    assert "tcp_user_timeout" not in args  # the URL's 60000 reaches the driver
    assert "keepalives" not in args
    assert args["keepalives_idle"] == 5


def test_sql_server_logins_give_up_and_queries_have_no_timeout():
    support = dialects.for_url("mssql")
    url = sa.make_url("mssql+pyodbc://u:p@h/d?driver=ODBC+Driver+18+for+SQL+Server")
    assert support.connect_args(url, {}) == {"timeout": 5}
    assert support.connect_args(url, {"timeout": 60}) == {"timeout": 60}


def test_sqlite_connects_with_nothing_of_the_network():
    assert dialects.for_url("sqlite").connect_defaults == ()
