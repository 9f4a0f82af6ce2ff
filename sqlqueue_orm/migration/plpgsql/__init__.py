"""PostgreSQL statements of the queue table steps: per named table, or a server-side loop.

Each step is a ``DO`` block that reads the table's state from ``pg_index`` / ``pg_attribute``
before acting (so it is idempotent and atomic), plus, for a named table, a
``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` (or ``DROP INDEX CONCURRENTLY IF EXISTS``) run
outside any transaction, so building an index never blocks senders and receivers. The looping
form is one ``DO`` block that finds the queue tables itself (``FOR ... IN SELECT`` over
``pg_class`` checking the column signature) and runs every statement with
``EXECUTE format('%I ... %s', ...)``; a ``DO`` block is a transaction, so there the indexes are
built without ``CONCURRENTLY``. Online ``sqlqueue migrate`` runs the named form.

Index names carry the table name on PostgreSQL (see
:func:`~sqlqueue_orm.models.queue_table.index_name`); the blocks compute them the same way
(``md5`` for names past 63 bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.migration import impl, steps
from sqlqueue_orm.migration.plpgsql import bodies
from sqlqueue_orm.migration.plpgsql.text import (
    Lines,
    Plan,
    Target,
    comment,
    compute_index_name,
    dialect,
    if_block,
    indented,
    signature_count,
)
from sqlqueue_orm.queuing import sql as queue_sql

_TAG = "$sqlqueue$"

#: Reads the schema and name of the table at hand (``tbl``) into ``nsp`` and ``rel``.
_READ_NAMES = (
    "SELECT n.nspname, c.relname INTO nsp, rel",
    "  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace",
    " WHERE c.oid = tbl;",
)

_SCHEMAS = steps.SchemaFilter(
    "n.nspname = ANY ({})", "n.nspname = current_schema()", "current_schema()"
)

_VARIABLES = (
    "nsp text;",
    "rel text;",
    "head text;",
    "ix text;",
    "other text;",
    "present boolean;",
    "valid boolean;",
    "uniq boolean;",
    "method text;",
    "keys text[];",
    "includes text[];",
    "predicate text;",
    "typ text;",
    "not_null boolean;",
    "ident text;",
    "dflt text;",
    "seq text;",
    "seqname text;",
    "next_value bigint;",
    "top bigint;",
)


def _is_queue(target: Target, relation: str, revision: str) -> str:
    """The condition that *relation* is a queue table step *revision* deals with."""
    old = f"{signature_count(target, relation)} = {len(steps.SIGNATURE)}"
    new = signature_count(target, relation, steps.NSB_SIGNATURE)
    if revision == steps.QUEUE_STORAGE:  # after 0008: NServiceBus's PostgreSQL layout
        return f"{new} = {len(steps.NSB_SIGNATURE)}"
    if revision != steps.NSB_LAYOUT:
        return old
    return f"({old} OR {new} = {len(steps.NSB_SIGNATURE)})"


def _for_tables(where: str) -> Lines:
    """The head of a loop over the tables (not partitions) that *where* selects."""
    return [
        "FOR tbl IN",
        "    SELECT c.oid::regclass",
        "      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace",
        "     WHERE c.relkind = 'r' AND NOT c.relispartition",
        f"       AND ({where})",
    ]


def _plan(revision: str, direction: str, target: Target) -> Plan:
    plan: Plan = _IMPL.body(revision, direction)(target)
    return plan


def _names(target: Target, plan: Plan) -> Lines:
    lines: Lines = []
    for variable, base in plan.names.items():
        lines += compute_index_name(target, variable, base)
    return lines


def _do(declarations: Iterable[str], body: Lines) -> str:
    text = "\n".join(
        ["DO " + _TAG, "DECLARE", *indented(declarations), "BEGIN", *indented(body), "END", _TAG]
    )
    if text.count(_TAG) != 2:
        raise exceptions.ConfigurationError(
            f"a schema or table name holds {_TAG!r}, which this script uses to quote its blocks"
        )
    return text


def table_statements(revision: str, direction: str, address: addressing.QueueAddress) -> list[str]:
    """The statements applying step *revision* in *direction* to the table at *address*.

    The ``DO`` block first, then (maybe) a ``CREATE/DROP INDEX CONCURRENTLY``, which must run
    outside a transaction block.
    """
    step = steps.step(revision, direction)
    target = Target(_IMPL, dialect(), address)
    plan = _plan(revision, direction, target)
    out = []
    header = f"-- queue {comment(str(address))}: {step.describe(direction)}"
    if plan.body:
        body = [
            *if_block(
                f"tbl IS NULL OR NOT {_is_queue(target, 'tbl', revision)}",
                [
                    "RAISE NOTICE 'queue %: no queue table there; skipped', "
                    f"{target.literal(str(address))};",
                    "RETURN;",
                ],
            ),
            *_READ_NAMES,
            *_names(target, plan),
            *plan.body,
        ]
        declarations = [
            f"tbl regclass := to_regclass({target.literal(target.quoted)});",
            *_VARIABLES,
        ]
        out.append(header + "\n" + _do(declarations, body))
        header = f"-- queue {comment(str(address))}: the index, without blocking writes"
    if plan.create is not None:
        index, where = plan.create
        out.append(header + "\n" + target.create(index, where=where))
    if plan.drop is not None:
        out.append(header + "\n" + target.drop(plan.drop))
    return out


def loop_statement(revision: str, direction: str, schemas: Sequence[str | None]) -> str:
    """One ``DO`` block applying step *revision* to every queue table in *schemas*.

    ``None`` in *schemas* stands for ``current_schema()`` of the session running the script.
    """
    step = steps.step(revision, direction)
    target = Target(_IMPL, dialect(), None)
    plan = _plan(revision, direction, target)
    selected, described = _SCHEMAS.select(schemas, target.array, target.quote)
    tail: Lines = []
    exists = (
        "EXISTS (SELECT 1 FROM pg_index AS i JOIN pg_class AS ic ON ic.oid = i.indexrelid "
        "WHERE i.indrelid = tbl AND ic.relname = ix)"
    )
    if plan.create is not None:
        index, where = plan.create
        fmt = target.literal(target.create_format(index, where=where))
        tail = if_block(f"NOT {exists}", [f"EXECUTE format({fmt}, ix, tbl);"])
    if plan.drop is not None:
        tail = if_block(exists, ["EXECUTE format('DROP INDEX %I.%I', nsp, ix);"])
    loop = [
        *_for_tables(selected),
        f"       AND {_is_queue(target, 'c.oid', revision)}",
        "     ORDER BY n.nspname, c.relname",
        "LOOP",
        *indented(
            [
                *_READ_NAMES,
                f"RAISE NOTICE 'queue %: {step.revision} {direction}', tbl;",
                *_names(target, plan),
                *plan.body,
                *tail,
            ]
        ),
        "END LOOP;",
    ]
    header = f"-- every queue table in {comment(described)}: {step.describe(direction)}"
    return header + "\n" + _do(["tbl regclass;", *_VARIABLES], loop)


def delayed_index_statement(schemas: Sequence[str | None]) -> str:
    """One ``DO`` block creating the missing index on due of the delayed tables of *schemas*.

    Named ``"<table>_Due"`` (NServiceBus's CreateDelayedMessageStoreText; past 63 bytes as
    :func:`~sqlqueue_orm.models.queue_table.index_name` names it).

    A delayed table: ``id, headers, body, due`` and no ``expires``. Safe to run twice.
    """
    target = Target(_IMPL, dialect(), None)
    selected, described = _SCHEMAS.select(schemas, target.array, target.quote)
    signature = dialects.postgresql.DELAYED_SIGNATURE
    loop = [
        *_for_tables(selected),
        f"       AND {signature_count(target, 'c.oid', signature)} = {len(signature)}",
        f"       AND {signature_count(target, 'c.oid', ('expires',))} = 0",
        "       AND NOT EXISTS (SELECT 1 FROM pg_index AS i JOIN pg_attribute AS a",
        "           ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]",
        "           WHERE i.indrelid = c.oid AND a.attname = 'due')",
        "     ORDER BY n.nspname, c.relname",
        "LOOP",
        *indented(
            [
                *_READ_NAMES,
                "RAISE NOTICE 'delayed table %: 0009_delayed_delivery upgrade', tbl;",
                *compute_index_name(target, "ix", "Due"),
                "EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (due)', ix, tbl);",
            ]
        ),
        "END LOOP;",
    ]
    header = f"-- every delayed table in {comment(described)}: create its index on due"
    return header + "\n" + _do(["tbl regclass;", "nsp text;", "rel text;", "head text;",
                                 "ix text;"], loop)

class PostgresqlImpl(impl.QueueTableImpl):
    """PostgreSQL: a ``DO`` block per table and step, then the index ``CONCURRENTLY``."""

    __dialect__ = "postgresql"
    offline = True

    # The step bodies, one function per step of steps.STEPS and direction.
    bodies = bodies

    def delayed_index_loop(self, schemas: Sequence[str | None]) -> str | None:
        """One ``DO`` block: :func:`delayed_index_statement`."""
        return delayed_index_statement(schemas)

    # -- the interface -------------------------------------------------------------------------
    def index_options(self, options: Any, variant: impl.IndexVariant) -> dict[str, Any]:
        """``postgresql_include`` / ``_where`` / ``_concurrently`` of an index variant."""
        return {
            "postgresql_include": options["include"],
            "postgresql_where": options["where"] if variant.where else None,
            "postgresql_concurrently": variant.concurrently,
        }

    def table_statements(
        self, revision: str, direction: str, address: addressing.QueueAddress
    ) -> list[str]:
        """:func:`table_statements`."""
        return table_statements(revision, direction, address)

    def loop_statements(
        self, revision: str, direction: str, schemas: Sequence[str | None]
    ) -> list[str]:
        """One ``DO`` block: :func:`loop_statement`."""
        return [loop_statement(revision, direction, schemas)]

    def layout(self, connection: Connection, address: addressing.QueueAddress) -> impl.Layout:
        """Columns, indexes and storage settings, as the steps leave them.

        Column types, NOT NULL, identity and defaults; each index's definition and validity;
        the table's ``reloptions`` (0011_queue_storage).

        A failed ``CONCURRENTLY`` build leaves an invalid index that the steps rebuild.
        """
        statement = sa.text(
            "SELECT 'column', a.attname::text, format_type(a.atttypid, a.atttypmod) || ' ' "
            "|| a.attnotnull::text || ' ' || a.attidentity::text || ' ' "
            "|| coalesce(pg_get_expr(d.adbin, d.adrelid), '') "
            "FROM pg_attribute AS a LEFT JOIN pg_attrdef AS d "
            "ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE a.attrelid = to_regclass(:table) AND a.attnum > 0 AND NOT a.attisdropped "
            "UNION ALL "
            "SELECT 'index', c.relname::text, pg_get_indexdef(i.indexrelid) || ' ' "
            "|| i.indisvalid::text || ' ' || i.indisclustered::text "
            "FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = to_regclass(:table) "
            "UNION ALL "  # storage settings (0011_queue_storage)
            "SELECT 'storage', '', coalesce(array_to_string(reloptions, ','), '') "
            "FROM pg_class WHERE oid = to_regclass(:table) ORDER BY 1, 2"
        ).bindparams(table=queue_sql.format_table(connection.dialect, address))
        return [tuple(row) for row in connection.execute(statement)]

    def skips(
        self, connection: Connection, address: addressing.QueueAddress, revision: str
    ) -> str | None:
        """A table in NServiceBus's PostgreSQL layout is past the steps before 0008.

        Those know only the SQL Server column layout.
        """
        if revision in (steps.NSB_LAYOUT, steps.QUEUE_STORAGE):
            return None
        if set(steps.NSB_SIGNATURE) <= db.column_names(connection, address):
            return "in NServiceBus's PostgreSQL layout"
        return None


_IMPL = PostgresqlImpl()
