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
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, db, dialects, exceptions
from sqlqueue_orm.migration import impl, steps
from sqlqueue_orm.queuing import sql as queue_sql

_TAG = "$sqlqueue$"
_INDENT = "    "
_MAX_IDENTIFIER = dialects.postgresql.IDENTIFIER_LIMIT
_DIGEST = 8

Lines = list[str]

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


def dialect() -> Dialect:
    """A PostgreSQL dialect for rendering (named paramstyle: no %-doubling)."""
    return postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]


def comment(text: str) -> str:
    """*text* made safe for a ``--`` comment line (names may hold line breaks)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _block(lines: Iterable[str], depth: int = 1) -> Lines:
    return [(_INDENT * depth + line) if line else line for line in lines]


def _if(condition: str, then: Lines) -> Lines:
    return [f"IF {condition} THEN", *_block(then), "END IF;"]


class _Target:
    """Renders statements for one named table, or for the loop's current table."""

    def __init__(self, dialect: Dialect, address: addressing.QueueAddress | None) -> None:
        self.dialect = dialect
        self.looping = address is None
        if address is None:
            address = addressing.QueueAddress(steps.PLACEHOLDER_TABLE, steps.PLACEHOLDER_SCHEMA)
        self.address = address
        self.table = steps.model_table(address)
        self.quoted = dialect.identifier_preparer.format_table(self.table)

    def literal(self, text: str) -> str:
        literal = sa.literal(text, sa.String())
        return str(literal.compile(dialect=self.dialect, compile_kwargs={"literal_binds": True}))

    def quote(self, name: str) -> str:
        return str(self.dialect.identifier_preparer.quote_identifier(name))

    def array(self, names: Sequence[str]) -> str:
        if not names:
            return "'{}'::text[]"
        return "ARRAY[" + ", ".join(self.literal(name) for name in names) + "]::text[]"

    def index(self, base: str) -> sa.Index:
        return steps.model_index(self.table, base, "postgresql")

    def create(self, index: sa.Index, *, where: bool = True) -> str:
        """``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` of a variant of model *index*."""
        copy = _IMPL.variant(index, where=where, concurrently=True)
        return steps.compile_ddl(sa.schema.CreateIndex(copy, if_not_exists=True), self.dialect)

    def create_format(self, index: sa.Index, *, where: bool = True) -> str:
        """A ``format()`` string creating *index*: ``%1$I`` its name, ``%2$s`` the table."""
        copy = _IMPL.variant(index, where=where)
        sql = steps.compile_ddl(sa.schema.CreateIndex(copy), self.dialect).replace("%", "%%")
        sql = sql.replace(self.quote(str(index.name)), "%1$I", 1)
        return sql.replace(self.quoted, "%2$s")

    def drop(self, index: sa.Index) -> str:
        copy = _IMPL.variant(index, concurrently=True)
        return steps.compile_ddl(sa.schema.DropIndex(copy, if_exists=True), self.dialect)


def _signature_count(
    target: _Target, relation: str, signature: Sequence[str] = steps.SIGNATURE
) -> str:
    names = ", ".join(target.literal(name) for name in signature)
    return (
        f"(SELECT count(*) FROM pg_attribute AS a WHERE a.attrelid = {relation} "
        f"AND a.attnum > 0 AND NOT a.attisdropped AND a.attname IN ({names}))"
    )


def _name(target: _Target, variable: str, base: str) -> Lines:
    """Compute in *variable* the name :func:`index_name` gives *base* of table ``rel``."""
    suffix = target.literal(f"_{base}")
    room = _MAX_IDENTIFIER - len(base) - _DIGEST - 2
    return [
        f"{variable} := rel || {suffix};",
        *_if(
            f"octet_length({variable}) > {_MAX_IDENTIFIER}",
            [
                "head := rel;",
                f"WHILE octet_length(head) > {room} LOOP",
                "    head := left(head, -1);",
                "END LOOP;",
                f"{variable} := head || '_' || left(md5(rel), {_DIGEST}) || {suffix};",
            ],
        ),
    ]


def _index_state() -> Lines:
    """Read index ``ix`` of ``tbl`` into present/valid/uniq/method/keys/includes/predicate."""
    return [
        "SELECT i.indisvalid AND i.indisready, i.indisunique, am.amname,",
        "       ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true)",
        "             FROM generate_series(1, i.indnkeyatts) AS k ORDER BY k),",
        "       ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true)",
        "             FROM generate_series(i.indnkeyatts + 1, i.indnatts) AS k ORDER BY k),",
        "       pg_get_expr(i.indpred, i.indrelid)",
        "  INTO valid, uniq, method, keys, includes, predicate",
        "  FROM pg_index AS i JOIN pg_class AS ic ON ic.oid = i.indexrelid",
        "  JOIN pg_am AS am ON am.oid = ic.relam",
        " WHERE i.indrelid = tbl AND ic.relname = ix;",
        "present := FOUND;",
    ]


def _adopt(target: _Target, column: str) -> Lines:
    """Rename an index on exactly (*column*) that has another name to ``ix``."""
    return _if(
        "NOT present",
        [
            "SELECT ic.relname INTO other",
            "  FROM pg_index AS i JOIN pg_class AS ic ON ic.oid = i.indexrelid",
            " WHERE i.indrelid = tbl AND NOT i.indisunique AND i.indisvalid",
            "   AND i.indnkeyatts = 1 AND i.indexprs IS NULL",
            "   AND pg_get_indexdef(i.indexrelid, 1, true) = "
            + target.literal(target.quote(column)),
            " ORDER BY ic.relname LIMIT 1;",
            *_if(
                "other IS NOT NULL",
                [
                    "EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', nsp, other, ix);",
                    "RAISE NOTICE 'queue %: renamed index % to %', tbl, other, ix;",
                    *_index_state(),
                ],
            ),
        ],
    )


def _drop_unless(condition: str) -> Lines:
    return _if(
        f"present AND NOT ({condition})",
        [
            "EXECUTE format('DROP INDEX %I.%I', nsp, ix);",
            "RAISE NOTICE 'queue %: dropped index % to build it anew', tbl, ix;",
            "present := false;",
        ],
    )


def _expires_filter(target: _Target) -> str:
    where = target.index(steps.EXPIRES_INDEX).dialect_options["postgresql"]["where"]
    text = where.compile(dialect=target.dialect, compile_kwargs={"include_table": False})
    return target.literal(f"({text})")  # pg_get_expr's parenthesized form


def _expires_shape(target: _Target) -> str:
    index = target.index(steps.EXPIRES_INDEX)
    keys = [target.quote(str(column.name)) for column in index.columns]
    include = [target.quote(name) for name in index.dialect_options["postgresql"]["include"]]
    return (
        f"valid AND NOT uniq AND method = 'btree' AND keys = {target.array(keys)} "
        f"AND includes @> {target.array(include)}"
    )


class _Plan:
    """One step on one table: a DO-block body, then maybe an index to create or drop."""

    def __init__(
        self,
        body: Lines,
        names: dict[str, str],
        create: tuple[sa.Index, bool] | None = None,
        drop: sa.Index | None = None,
    ) -> None:
        self.body = body
        #: variable -> index base name it holds
        self.names = names
        self.create = create
        self.drop = drop


def _expires_up(target: _Target) -> _Plan:
    body = [
        *_index_state(),
        "-- adopt an index on (Expires) that has another name",
        *_adopt(target, "Expires"),
        "-- a failed CREATE INDEX CONCURRENTLY leaves an invalid index: drop it, build anew",
        *_drop_unless(_expires_shape(target)),
    ]
    index = target.index(steps.EXPIRES_INDEX)
    return _Plan(body, {"ix": steps.EXPIRES_INDEX}, create=(index, True))


def _expires_down(target: _Target) -> _Plan:
    return _Plan([], {"ix": steps.EXPIRES_INDEX}, drop=target.index(steps.EXPIRES_INDEX))


def _filter_up(target: _Target) -> _Plan:
    body = [
        *_index_state(),
        *_drop_unless(f"valid AND predicate IS NOT DISTINCT FROM {_expires_filter(target)}"),
    ]
    index = target.index(steps.EXPIRES_INDEX)
    return _Plan(body, {"ix": steps.EXPIRES_INDEX}, create=(index, True))


def _filter_down(target: _Target) -> _Plan:
    body = [*_index_state(), *_drop_unless("valid AND predicate IS NULL")]
    index = target.index(steps.EXPIRES_INDEX)
    return _Plan(body, {"ix": steps.EXPIRES_INDEX}, create=(index, False))


def _column_state(target: _Target, column: str) -> Lines:
    return [
        "SELECT format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity::text,",
        "       pg_get_expr(d.adbin, d.adrelid)",
        "  INTO typ, not_null, ident, dflt",
        "  FROM pg_attribute AS a",
        "  LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum",
        f" WHERE a.attrelid = tbl AND a.attname = {target.literal(column)} AND NOT a.attisdropped;",
    ]


def _headers_up(target: _Target) -> _Plan:
    headers = target.quote("Headers")
    text = str(target.table.c.Headers.type.compile(dialect=target.dialect))
    body = [
        *_column_state(target, "Headers"),
        "-- varchar -> text is binary coercible: no rewrite, a brief ACCESS EXCLUSIVE lock",
        "IF typ LIKE 'character varying%' THEN",
        "    " + _execute(target, f"ALTER TABLE %s ALTER COLUMN {headers} TYPE {text}", "tbl"),
        f"ELSIF typ <> {target.literal(text.lower())} THEN",
        f"    RAISE EXCEPTION 'queue %: column {headers} is %, not text or varchar; "
        "convert it by hand', tbl, typ;",
        "END IF;",
        *_if(
            "NOT not_null",
            [
                "EXECUTE format("
                + target.literal(f"ALTER TABLE %s ALTER COLUMN {headers} SET NOT NULL")
                + ", tbl);"
            ],
        ),
    ]
    return _Plan(body, {})


def _headers_down(target: _Target) -> _Plan:
    headers = target.quote("Headers")
    body = [
        *_column_state(target, "Headers"),
        *_if(
            "typ = 'text'",
            [
                "EXECUTE format("
                + target.literal(f"ALTER TABLE %s ALTER COLUMN {headers} TYPE character varying")
                + ", tbl);"
            ],
        ),
    ]
    return _Plan(body, {})


def _execute(target: _Target, sql: str, *arguments: str) -> str:
    return f"EXECUTE format({target.literal(sql)}, {', '.join(arguments)});"


def _next_value(target: _Target, row_version: str) -> Lines:
    """``next_value``: the next RowVersion, past both the sequence ``seq`` and the table."""
    return [
        "next_value := 1;",
        *_if(
            "seq IS NOT NULL",
            [
                "EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 "
                "ELSE last_value END FROM %s', seq) INTO next_value;"
            ],
        ),
        f"EXECUTE format({target.literal(f'SELECT max({row_version}) FROM %s')}, tbl) INTO top;",
        "next_value := greatest(next_value, coalesce(top + 1, 1));",
    ]


def _row_version_up(target: _Target) -> _Plan:
    row_version = target.quote("RowVersion")
    index = target.index(steps.ROW_VERSION_INDEX)
    keys = [target.quote(str(column.name)) for column in index.columns]
    identity = [
        "-- a serial RowVersion (a sequence default) becomes an identity column that goes on",
        "-- from the sequence: no rewrite, ACCESS EXCLUSIVE for a moment",
        "seq := pg_get_serial_sequence(tbl::text, 'RowVersion');",
        *_next_value(target, row_version),
        *_if(
            "dflt IS NOT NULL",
            [_execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} DROP DEFAULT", "tbl")],
        ),
        *_if("seq IS NOT NULL", ["EXECUTE format('DROP SEQUENCE %s', seq);"]),
        *_if(
            "NOT not_null",
            [_execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} SET NOT NULL", "tbl")],
        ),
        _execute(
            target,
            f"ALTER TABLE %s ALTER COLUMN {row_version} ADD GENERATED BY DEFAULT AS IDENTITY "
            "(START WITH %s)",
            "tbl",
            "next_value",
        ),
    ]
    body = [
        *_column_state(target, "RowVersion"),
        *_if(
            "typ NOT IN ('bigint', 'integer', 'smallint')",
            [
                f"RAISE EXCEPTION 'queue %: column {row_version} is %, not an integer', tbl, typ;",
            ],
        ),
        *_if(
            "typ <> 'bigint' OR ident = ''",
            [_execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl")],
        ),
        "-- integer -> bigint rewrites the table (ACCESS EXCLUSIVE for its duration)",
        *_if(
            "typ <> 'bigint'",
            [_execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} TYPE bigint", "tbl")],
        ),
        *_if("ident = ''", identity),
        *_index_state(),
        "-- adopt an index on (RowVersion) that has another name",
        *_adopt(target, "RowVersion"),
        *_drop_unless(
            f"valid AND NOT uniq AND method = 'btree' AND keys = {target.array(keys)} "
            "AND includes = '{}'::text[] AND predicate IS NULL"
        ),
    ]
    return _Plan(body, {"ix": steps.ROW_VERSION_INDEX}, create=(index, True))


def _row_version_down(target: _Target) -> _Plan:
    row_version = target.quote("RowVersion")
    serial = [
        "-- back to a serial column: a sequence owned by the column, going on from the identity",
        _execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl"),
        "seq := pg_get_serial_sequence(tbl::text, 'RowVersion');",
        *_next_value(target, row_version),
        _execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} DROP IDENTITY", "tbl"),
        _execute(
            target,
            f"CREATE SEQUENCE %I.%I AS bigint START WITH %s OWNED BY %s.{row_version}",
            "nsp",
            "seqname",
            "next_value",
            "tbl",
        ),
        _execute(
            target,
            f"ALTER TABLE %s ALTER COLUMN {row_version} SET DEFAULT nextval(%L::regclass)",
            "tbl",
            "format('%I.%I', nsp, seqname)",
        ),
    ]
    body = [*_column_state(target, "RowVersion"), *_if("ident <> ''", serial)]
    return _Plan(body, {"seqname": "RowVersion_seq"})


def _has_column(target: _Target, name: str) -> str:
    return (
        "EXISTS (SELECT 1 FROM pg_attribute AS a WHERE a.attrelid = tbl AND a.attnum > 0 "
        f"AND NOT a.attisdropped AND a.attname = {target.literal(name)})"
    )


def _in_nsb_layout(target: _Target) -> str:
    return f"{_signature_count(target, 'tbl', steps.NSB_SIGNATURE)} = {len(steps.NSB_SIGNATURE)}"


def _rename(target: _Target, old: str, new: str) -> Lines:
    return _if(
        _has_column(target, old),
        [
            _execute(
                target,
                f"ALTER TABLE %s RENAME COLUMN {target.quote(old)} TO {target.quote(new)}",
                "tbl",
            )
        ],
    )


def _keep_if_used(target: _Target, legacy: str) -> Lines:
    """Drop column *legacy* when no row has a value in it, else rename it to lower case."""
    return _if(
        _has_column(target, legacy),
        [
            _execute(
                target,
                f"SELECT EXISTS (SELECT 1 FROM %s WHERE {target.quote(legacy)} IS NOT NULL)",
                "tbl",
            )[:-1]
            + " INTO present;",
            "IF present THEN",
            "    "
            + _execute(
                target,
                f"ALTER TABLE %s RENAME COLUMN {target.quote(legacy)} "
                f"TO {target.quote(legacy.lower())}",
                "tbl",
            ),
            f"    RAISE NOTICE 'queue %: kept column {legacy.lower()} (it holds values)', tbl;",
            "ELSE",
            "    " + _execute(target, f"ALTER TABLE %s DROP COLUMN {target.quote(legacy)}", "tbl"),
            "END IF;",
        ],
    )


def _nsb_up(target: _Target) -> _Plan:
    # Facts from NServiceBus.Transport.PostgreSql PostgreSqlConstants.CreateQueueText
    # (Particular/NServiceBus.SqlServer 214c4e8f06175186e356677546ea2d8e0f2b0c55).
    # Renames and drops are catalog-only; the primary key and the unique seq build one index
    # each under the lock. Index_Expires follows the renames by itself (indexes hold attnums).
    convert: Lines = [
        _execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl"),
        _execute(target, 'SELECT count(*) - count(DISTINCT "Id") FROM %s', "tbl")[:-1]
        + " INTO top;",
        *_if(
            "top > 0",
            [
                "RAISE EXCEPTION 'queue %: % row(s) share an Id with another row; "
                "NServiceBus''s PostgreSQL layout makes id the primary key: receive or delete "
                "the duplicates, then migrate again', tbl, top;"
            ],
        ),
        "-- CorrelationId and ReplyToAddress: the headers carry both; dropped when empty, else",
        "-- kept (lower case, nullable, ignored by both sides) so no stored value is lost",
    ]
    for legacy in ("CorrelationId", "ReplyToAddress"):
        convert += _keep_if_used(target, legacy)
    convert += [
        "-- Recoverable: always true, read by no one; NServiceBus's PostgreSQL sends lack it",
        *_if(
            _has_column(target, "Recoverable"),
            [_execute(target, f"ALTER TABLE %s DROP COLUMN {target.quote('Recoverable')}", "tbl")],
        ),
    ]
    for old, new in steps.NSB_RENAMES.items():
        convert += _rename(target, old, new)
    convert += [
        "-- the unique seq replaces Index_RowVersion",
        "EXECUTE format('DROP INDEX IF EXISTS %I.%I', nsp, ix);",
        _execute(target, "ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (id)", "tbl", "other"),
        _execute(target, "ALTER TABLE %s ADD CONSTRAINT %I UNIQUE (seq)", "tbl", "seqname"),
        "RAISE NOTICE 'queue %: now in NServiceBus''s PostgreSQL layout', tbl;",
    ]
    body = _if(f"NOT {_in_nsb_layout(target)}", convert)
    names = {"ix": steps.ROW_VERSION_INDEX, "other": "pkey", "seqname": "seq_key"}
    return _Plan(body, names)


def _nsb_down(target: _Target) -> _Plan:
    convert: Lines = [
        _execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl"),
        _execute(target, "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I", "tbl", "other"),
        _execute(target, "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I", "tbl", "seqname"),
    ]
    for old, new in steps.NSB_RENAMES.items():
        convert += _rename(target, new, old)
    for legacy in ("CorrelationId", "ReplyToAddress"):
        convert += [
            "IF "
            + _has_column(target, legacy.lower())
            + " THEN",
            "    "
            + _execute(
                target,
                f"ALTER TABLE %s RENAME COLUMN {target.quote(legacy.lower())} "
                f"TO {target.quote(legacy)}",
                "tbl",
            ),
            "ELSE",
            "    "
            + _execute(
                target, f"ALTER TABLE %s ADD COLUMN {target.quote(legacy)} varchar(255)", "tbl"
            ),
            "END IF;",
        ]
    recoverable = target.quote("Recoverable")
    convert += [
        _execute(
            target, f"ALTER TABLE %s ADD COLUMN {recoverable} boolean NOT NULL DEFAULT true", "tbl"
        ),
        _execute(target, f"ALTER TABLE %s ALTER COLUMN {recoverable} DROP DEFAULT", "tbl"),
    ]
    body = _if(_in_nsb_layout(target), convert)
    names = {"other": "pkey", "seqname": "seq_key", "ix": steps.ROW_VERSION_INDEX}
    return _Plan(body, names, create=(target.index(steps.ROW_VERSION_INDEX), True))


def _is_queue(target: _Target, relation: str, revision: str) -> str:
    """The condition that *relation* is a queue table step *revision* deals with."""
    old = f"{_signature_count(target, relation)} = {len(steps.SIGNATURE)}"
    new = _signature_count(target, relation, steps.NSB_SIGNATURE)
    if revision == steps.QUEUE_STORAGE:  # after 0008: NServiceBus's PostgreSQL layout
        return f"{new} = {len(steps.NSB_SIGNATURE)}"
    if revision != steps.NSB_LAYOUT:
        return old
    return f"({old} OR {new} = {len(steps.NSB_SIGNATURE)})"


def _plan(revision: str, direction: str, target: _Target) -> _Plan:
    plan: _Plan = _IMPL.body(revision, direction)(target)
    return plan


def _names(target: _Target, plan: _Plan) -> Lines:
    lines: Lines = []
    for variable, base in plan.names.items():
        lines += _name(target, variable, base)
    return lines


def _do(declarations: Iterable[str], body: Lines) -> str:
    text = "\n".join(
        ["DO " + _TAG, "DECLARE", *_block(declarations), "BEGIN", *_block(body), "END", _TAG]
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
    target = _Target(dialect(), address)
    plan = _plan(revision, direction, target)
    out = []
    header = f"-- queue {comment(str(address))}: {step.describe(direction)}"
    if plan.body:
        body = [
            *_if(
                f"tbl IS NULL OR NOT {_is_queue(target, 'tbl', revision)}",
                [
                    "RAISE NOTICE 'queue %: no queue table there; skipped', "
                    f"{target.literal(str(address))};",
                    "RETURN;",
                ],
            ),
            "SELECT n.nspname, c.relname INTO nsp, rel",
            "  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace",
            " WHERE c.oid = tbl;",
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
    target = _Target(dialect(), None)
    plan = _plan(revision, direction, target)
    named = [schema for schema in schemas if schema is not None]
    conditions = []
    if named:
        conditions.append(f"n.nspname = ANY ({target.array(named)})")
    if None in schemas or not named:
        conditions.append("n.nspname = current_schema()")
    tail: Lines = []
    exists = (
        "EXISTS (SELECT 1 FROM pg_index AS i JOIN pg_class AS ic ON ic.oid = i.indexrelid "
        "WHERE i.indrelid = tbl AND ic.relname = ix)"
    )
    if plan.create is not None:
        index, where = plan.create
        fmt = target.literal(target.create_format(index, where=where))
        tail = _if(f"NOT {exists}", [f"EXECUTE format({fmt}, ix, tbl);"])
    if plan.drop is not None:
        tail = _if(exists, ["EXECUTE format('DROP INDEX %I.%I', nsp, ix);"])
    loop = [
        "FOR tbl IN",
        "    SELECT c.oid::regclass",
        "      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace",
        "     WHERE c.relkind = 'r' AND NOT c.relispartition",
        f"       AND ({' OR '.join(conditions)})",
        f"       AND {_is_queue(target, 'c.oid', revision)}",
        "     ORDER BY n.nspname, c.relname",
        "LOOP",
        *_block(
            [
                "SELECT n.nspname, c.relname INTO nsp, rel",
                "  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace",
                " WHERE c.oid = tbl;",
                f"RAISE NOTICE 'queue %: {step.revision} {direction}', tbl;",
                *_names(target, plan),
                *plan.body,
                *tail,
            ]
        ),
        "END LOOP;",
    ]
    described = ", ".join(
        "current_schema()" if schema is None else target.quote(schema) for schema in schemas
    )
    header = f"-- every queue table in {comment(described)}: {step.describe(direction)}"
    return header + "\n" + _do(["tbl regclass;", *_VARIABLES], loop)


def delayed_index_statement(schemas: Sequence[str | None]) -> str:
    """One ``DO`` block creating the missing index on due of the delayed tables of *schemas*.

    Named ``"<table>_Due"`` (NServiceBus's CreateDelayedMessageStoreText; past 63 bytes as
    :func:`~sqlqueue_orm.models.queue_table.index_name` names it).

    A delayed table: ``id, headers, body, due`` and no ``expires``. Safe to run twice.
    """
    target = _Target(dialect(), None)
    named = [schema for schema in schemas if schema is not None]
    conditions = []
    if named:
        conditions.append(f"n.nspname = ANY ({target.array(named)})")
    if None in schemas or not named:
        conditions.append("n.nspname = current_schema()")
    signature = dialects.postgresql.DELAYED_SIGNATURE
    loop = [
        "FOR tbl IN",
        "    SELECT c.oid::regclass",
        "      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace",
        "     WHERE c.relkind = 'r' AND NOT c.relispartition",
        f"       AND ({' OR '.join(conditions)})",
        f"       AND {_signature_count(target, 'c.oid', signature)} = {len(signature)}",
        f"       AND {_signature_count(target, 'c.oid', ('expires',))} = 0",
        "       AND NOT EXISTS (SELECT 1 FROM pg_index AS i JOIN pg_attribute AS a",
        "           ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]",
        "           WHERE i.indrelid = c.oid AND a.attname = 'due')",
        "     ORDER BY n.nspname, c.relname",
        "LOOP",
        *_block(
            [
                "SELECT n.nspname, c.relname INTO nsp, rel",
                "  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace",
                " WHERE c.oid = tbl;",
                "RAISE NOTICE 'delayed table %: 0009_delayed_delivery upgrade', tbl;",
                *_name(target, "ix", "Due"),
                "EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (due)', ix, tbl);",
            ]
        ),
        "END LOOP;",
    ]
    described = ", ".join(
        "current_schema()" if schema is None else target.quote(schema) for schema in schemas
    )
    header = f"-- every delayed table in {comment(described)}: create its index on due"
    return header + "\n" + _do(["tbl regclass;", "nsp text;", "rel text;", "head text;",
                                 "ix text;"], loop)


def _storage_up(target: _Target) -> _Plan:
    # Catalog only (ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock, rewrites nothing).
    settings = ", ".join(f"{name}={value}" for name, value in dialects.postgresql.QUEUE_STORAGE)
    return _Plan(
        [
            _execute(target, f"ALTER TABLE %s SET ({settings})", "tbl"),
            "RAISE NOTICE 'queue %: storage settings set', tbl;",
        ],
        {},
    )


def _storage_down(target: _Target) -> _Plan:
    names = ", ".join(name for name, _ in dialects.postgresql.QUEUE_STORAGE)
    return _Plan([_execute(target, f"ALTER TABLE %s RESET ({names})", "tbl")], {})


class PostgresqlImpl(impl.QueueTableImpl):
    """PostgreSQL: a ``DO`` block per table and step, then the index ``CONCURRENTLY``."""

    __dialect__ = "postgresql"
    offline = True

    # The steps, each named after its concern in steps.STEPS (Step.method).
    upgrade_expires_index = staticmethod(_expires_up)
    downgrade_expires_index = staticmethod(_expires_down)
    upgrade_headers_nvarchar = staticmethod(_headers_up)
    downgrade_headers_nvarchar = staticmethod(_headers_down)
    upgrade_filter_expires_index = staticmethod(_filter_up)
    downgrade_filter_expires_index = staticmethod(_filter_down)
    upgrade_rowversion_layout = staticmethod(_row_version_up)
    downgrade_rowversion_layout = staticmethod(_row_version_down)
    upgrade_postgresql_nsb_layout = staticmethod(_nsb_up)
    downgrade_postgresql_nsb_layout = staticmethod(_nsb_down)
    upgrade_queue_storage = staticmethod(_storage_up)
    downgrade_queue_storage = staticmethod(_storage_down)

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
