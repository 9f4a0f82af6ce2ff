"""The bodies of the queue table steps in PL/pgSQL, one function per step and direction.

Each takes the :class:`~sqlqueue_orm.migration.plpgsql.text.Target` and returns its
:class:`~sqlqueue_orm.migration.plpgsql.text.Plan`: the ``DO`` block's body, then maybe an
index to create or drop; :class:`~sqlqueue_orm.migration.plpgsql.PostgresqlImpl` names them
after the steps' concerns in :data:`~sqlqueue_orm.migration.steps.STEPS`.
"""

from __future__ import annotations

from sqlqueue_orm import dialects
from sqlqueue_orm.migration import steps

# Much the same names as tsql/bodies.py imports from its text module, on purpose: each
# dialect's text module offers the steps the same helpers, writing its own SQL.
from sqlqueue_orm.migration.plpgsql.text import (
    Lines,
    Plan,
    Target,
    adopt_index,
    column_state,
    drop_unless,
    execute,
    has_column,
    if_block,
    index_state,
    signature_count,
)


def _expires_filter(target: Target) -> str:
    text = steps.index_filter(target.index(steps.EXPIRES_INDEX), target.dialect)
    return target.literal(f"({text})")  # pg_get_expr's parenthesized form


def _expires_shape(target: Target) -> str:
    index = target.index(steps.EXPIRES_INDEX)
    keys = [target.quote(str(column.name)) for column in index.columns]
    include = [target.quote(name) for name in index.dialect_options["postgresql"]["include"]]
    return (
        f"valid AND NOT uniq AND method = 'btree' AND keys = {target.array(keys)} "
        f"AND includes @> {target.array(include)}"
    )


def upgrade_expires_index(target: Target) -> Plan:
    """0001 up: Index_Expires on (Expires) INCLUDE (Id, RowVersion), built anew if broken."""
    body = [
        *index_state(),
        "-- adopt an index on (Expires) that has another name",
        *adopt_index(target, "Expires"),
        "-- a failed CREATE INDEX CONCURRENTLY leaves an invalid index: drop it, build anew",
        *drop_unless(_expires_shape(target)),
    ]
    index = target.index(steps.EXPIRES_INDEX)
    return Plan(body, {"ix": steps.EXPIRES_INDEX}, create=(index, True))


def downgrade_expires_index(target: Target) -> Plan:
    """0001 down: drop Index_Expires."""
    return Plan([], {"ix": steps.EXPIRES_INDEX}, drop=target.index(steps.EXPIRES_INDEX))


def upgrade_filter_expires_index(target: Target) -> Plan:
    """0003 up: Index_Expires filtered to rows with an Expires."""
    body = [
        *index_state(),
        *drop_unless(f"valid AND predicate IS NOT DISTINCT FROM {_expires_filter(target)}"),
    ]
    index = target.index(steps.EXPIRES_INDEX)
    return Plan(body, {"ix": steps.EXPIRES_INDEX}, create=(index, True))


def downgrade_filter_expires_index(target: Target) -> Plan:
    """0003 down: Index_Expires unfiltered again."""
    body = [*index_state(), *drop_unless("valid AND predicate IS NULL")]
    index = target.index(steps.EXPIRES_INDEX)
    return Plan(body, {"ix": steps.EXPIRES_INDEX}, create=(index, False))


def upgrade_headers_nvarchar(target: Target) -> Plan:
    """0002 up: Headers becomes text NOT NULL (a varchar one is converted)."""
    headers = target.quote("Headers")
    text = str(target.table.c.Headers.type.compile(dialect=target.dialect))
    body = [
        *column_state(target, "Headers"),
        "-- varchar -> text is binary coercible: no rewrite, a brief ACCESS EXCLUSIVE lock",
        "IF typ LIKE 'character varying%' THEN",
        "    " + execute(target, f"ALTER TABLE %s ALTER COLUMN {headers} TYPE {text}", "tbl"),
        f"ELSIF typ <> {target.literal(text.lower())} THEN",
        f"    RAISE EXCEPTION 'queue %: column {headers} is %, not text or varchar; "
        "convert it by hand', tbl, typ;",
        "END IF;",
        *if_block(
            "NOT not_null",
            [
                "EXECUTE format("
                + target.literal(f"ALTER TABLE %s ALTER COLUMN {headers} SET NOT NULL")
                + ", tbl);"
            ],
        ),
    ]
    return Plan(body, {})


def downgrade_headers_nvarchar(target: Target) -> Plan:
    """0002 down: Headers back to varchar."""
    headers = target.quote("Headers")
    body = [
        *column_state(target, "Headers"),
        *if_block(
            "typ = 'text'",
            [
                "EXECUTE format("
                + target.literal(f"ALTER TABLE %s ALTER COLUMN {headers} TYPE character varying")
                + ", tbl);"
            ],
        ),
    ]
    return Plan(body, {})


def _next_value(target: Target, row_version: str) -> Lines:
    """``next_value``: the next RowVersion, past both the sequence ``seq`` and the table."""
    return [
        "next_value := 1;",
        *if_block(
            "seq IS NOT NULL",
            [
                "EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 "
                "ELSE last_value END FROM %s', seq) INTO next_value;"
            ],
        ),
        f"EXECUTE format({target.literal(f'SELECT max({row_version}) FROM %s')}, tbl) INTO top;",
        "next_value := greatest(next_value, coalesce(top + 1, 1));",
    ]


def upgrade_rowversion_layout(target: Target) -> Plan:
    """0004 up: RowVersion a bigint identity, Index_RowVersion on it alone."""
    row_version = target.quote("RowVersion")
    index = target.index(steps.ROW_VERSION_INDEX)
    keys = [target.quote(str(column.name)) for column in index.columns]
    identity = [
        "-- a serial RowVersion (a sequence default) becomes an identity column that goes on",
        "-- from the sequence: no rewrite, ACCESS EXCLUSIVE for a moment",
        "seq := pg_get_serial_sequence(tbl::text, 'RowVersion');",
        *_next_value(target, row_version),
        *if_block(
            "dflt IS NOT NULL",
            [execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} DROP DEFAULT", "tbl")],
        ),
        *if_block("seq IS NOT NULL", ["EXECUTE format('DROP SEQUENCE %s', seq);"]),
        *if_block(
            "NOT not_null",
            [execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} SET NOT NULL", "tbl")],
        ),
        execute(
            target,
            f"ALTER TABLE %s ALTER COLUMN {row_version} ADD GENERATED BY DEFAULT AS IDENTITY "
            "(START WITH %s)",
            "tbl",
            "next_value",
        ),
    ]
    body = [
        *column_state(target, "RowVersion"),
        *if_block(
            "typ NOT IN ('bigint', 'integer', 'smallint')",
            [
                f"RAISE EXCEPTION 'queue %: column {row_version} is %, not an integer', tbl, typ;",
            ],
        ),
        *if_block(
            "typ <> 'bigint' OR ident = ''",
            [execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl")],
        ),
        "-- integer -> bigint rewrites the table (ACCESS EXCLUSIVE for its duration)",
        *if_block(
            "typ <> 'bigint'",
            [execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} TYPE bigint", "tbl")],
        ),
        *if_block("ident = ''", identity),
        *index_state(),
        "-- adopt an index on (RowVersion) that has another name",
        *adopt_index(target, "RowVersion"),
        *drop_unless(
            f"valid AND NOT uniq AND method = 'btree' AND keys = {target.array(keys)} "
            "AND includes = '{}'::text[] AND predicate IS NULL"
        ),
    ]
    return Plan(body, {"ix": steps.ROW_VERSION_INDEX}, create=(index, True))


def downgrade_rowversion_layout(target: Target) -> Plan:
    """0004 down: RowVersion a serial column again."""
    row_version = target.quote("RowVersion")
    serial = [
        "-- back to a serial column: a sequence owned by the column, going on from the identity",
        execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl"),
        "seq := pg_get_serial_sequence(tbl::text, 'RowVersion');",
        *_next_value(target, row_version),
        execute(target, f"ALTER TABLE %s ALTER COLUMN {row_version} DROP IDENTITY", "tbl"),
        execute(
            target,
            f"CREATE SEQUENCE %I.%I AS bigint START WITH %s OWNED BY %s.{row_version}",
            "nsp",
            "seqname",
            "next_value",
            "tbl",
        ),
        execute(
            target,
            f"ALTER TABLE %s ALTER COLUMN {row_version} SET DEFAULT nextval(%L::regclass)",
            "tbl",
            "format('%I.%I', nsp, seqname)",
        ),
    ]
    body = [*column_state(target, "RowVersion"), *if_block("ident <> ''", serial)]
    return Plan(body, {"seqname": "RowVersion_seq"})


def _in_nsb_layout(target: Target) -> str:
    return f"{signature_count(target, 'tbl', steps.NSB_SIGNATURE)} = {len(steps.NSB_SIGNATURE)}"


def _rename(target: Target, old: str, new: str) -> Lines:
    return if_block(
        has_column(target, old),
        [
            execute(
                target,
                f"ALTER TABLE %s RENAME COLUMN {target.quote(old)} TO {target.quote(new)}",
                "tbl",
            )
        ],
    )


def _keep_if_used(target: Target, legacy: str) -> Lines:
    """Drop column *legacy* when no row has a value in it, else rename it to lower case."""
    return if_block(
        has_column(target, legacy),
        [
            execute(
                target,
                f"SELECT EXISTS (SELECT 1 FROM %s WHERE {target.quote(legacy)} IS NOT NULL)",
                "tbl",
            )[:-1]
            + " INTO present;",
            "IF present THEN",
            "    "
            + execute(
                target,
                f"ALTER TABLE %s RENAME COLUMN {target.quote(legacy)} "
                f"TO {target.quote(legacy.lower())}",
                "tbl",
            ),
            f"    RAISE NOTICE 'queue %: kept column {legacy.lower()} (it holds values)', tbl;",
            "ELSE",
            "    " + execute(target, f"ALTER TABLE %s DROP COLUMN {target.quote(legacy)}", "tbl"),
            "END IF;",
        ],
    )


def upgrade_postgresql_nsb_layout(target: Target) -> Plan:
    """0008 up: to NServiceBus's PostgreSQL layout (id ... seq)."""
    # Facts from NServiceBus.Transport.PostgreSql PostgreSqlConstants.CreateQueueText
    # (Particular/NServiceBus.SqlServer 214c4e8f06175186e356677546ea2d8e0f2b0c55).
    # Renames and drops are catalog-only; the primary key and the unique seq build one index
    # each under the lock. Index_Expires follows the renames by itself (indexes hold attnums).
    convert: Lines = [
        execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl"),
        execute(target, 'SELECT count(*) - count(DISTINCT "Id") FROM %s', "tbl")[:-1]
        + " INTO top;",
        *if_block(
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
        *if_block(
            has_column(target, "Recoverable"),
            [execute(target, f"ALTER TABLE %s DROP COLUMN {target.quote('Recoverable')}", "tbl")],
        ),
    ]
    for old, new in steps.NSB_RENAMES.items():
        convert += _rename(target, old, new)
    convert += [
        "-- the unique seq replaces Index_RowVersion",
        "EXECUTE format('DROP INDEX IF EXISTS %I.%I', nsp, ix);",
        execute(target, "ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (id)", "tbl", "other"),
        execute(target, "ALTER TABLE %s ADD CONSTRAINT %I UNIQUE (seq)", "tbl", "seqname"),
        "RAISE NOTICE 'queue %: now in NServiceBus''s PostgreSQL layout', tbl;",
    ]
    body = if_block(f"NOT {_in_nsb_layout(target)}", convert)
    names = {"ix": steps.ROW_VERSION_INDEX, "other": "pkey", "seqname": "seq_key"}
    return Plan(body, names)


def downgrade_postgresql_nsb_layout(target: Target) -> Plan:
    """0008 down: back to the SQL Server column layout (``"Id"`` ... ``"RowVersion"``)."""
    convert: Lines = [
        execute(target, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "tbl"),
        execute(target, "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I", "tbl", "other"),
        execute(target, "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I", "tbl", "seqname"),
    ]
    for old, new in steps.NSB_RENAMES.items():
        convert += _rename(target, new, old)
    for legacy in ("CorrelationId", "ReplyToAddress"):
        convert += [
            "IF "
            + has_column(target, legacy.lower())
            + " THEN",
            "    "
            + execute(
                target,
                f"ALTER TABLE %s RENAME COLUMN {target.quote(legacy.lower())} "
                f"TO {target.quote(legacy)}",
                "tbl",
            ),
            "ELSE",
            "    "
            + execute(
                target, f"ALTER TABLE %s ADD COLUMN {target.quote(legacy)} varchar(255)", "tbl"
            ),
            "END IF;",
        ]
    recoverable = target.quote("Recoverable")
    convert += [
        execute(
            target, f"ALTER TABLE %s ADD COLUMN {recoverable} boolean NOT NULL DEFAULT true", "tbl"
        ),
        execute(target, f"ALTER TABLE %s ALTER COLUMN {recoverable} DROP DEFAULT", "tbl"),
    ]
    body = if_block(_in_nsb_layout(target), convert)
    names = {"other": "pkey", "seqname": "seq_key", "ix": steps.ROW_VERSION_INDEX}
    return Plan(body, names, create=(target.index(steps.ROW_VERSION_INDEX), True))


def upgrade_queue_storage(target: Target) -> Plan:
    """0011 up: the storage settings of a churning table."""
    # Catalog only (ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock, rewrites nothing).
    settings = ", ".join(f"{name}={value}" for name, value in dialects.postgresql.QUEUE_STORAGE)
    return Plan(
        [
            execute(target, f"ALTER TABLE %s SET ({settings})", "tbl"),
            "RAISE NOTICE 'queue %: storage settings set', tbl;",
        ],
        {},
    )


def downgrade_queue_storage(target: Target) -> Plan:
    """0011 down: the server's storage defaults again."""
    names = ", ".join(name for name, _ in dialects.postgresql.QUEUE_STORAGE)
    return Plan([execute(target, f"ALTER TABLE %s RESET ({names})", "tbl")], {})
