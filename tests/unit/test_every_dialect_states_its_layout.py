"""Every registered dialect states each field that describes its tables, statements and errors.

Such a field of ``DialectSupport`` has no default, so a dialect that leaves one out fails as it
is built rather than taking another database's value; this test names the field instead. The
checklist for a new database is docs/adding-a-database.md.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

from sqlqueue_orm import dialects
from sqlqueue_orm.dialects import base

REQUIRED = sorted(
    field.name
    for field in dataclasses.fields(base.DialectSupport)
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
)


def test_the_layout_fields_have_no_default() -> None:
    # the ones a database this package does not know would otherwise take from SQL Server
    for name in ("address_form", "queue_layout", "queue_signature", "identifier_limit",
                 "transient_markers", "subscribe", "control", "delayed_signature"):
        assert name in REQUIRED


@pytest.mark.parametrize("name", sorted(dialects.ALL))
def test_the_dialect_states_every_field_without_a_default(name: str) -> None:
    support = dialects.ALL[name]
    module = inspect.getmodule(type(support))
    assert module is not None
    tree = ast.parse(inspect.getsource(module))
    [call] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "SUPPORT" for target in node.targets)
        and isinstance(node.value, ast.Call)
    ]
    stated = {keyword.arg for keyword in call.keywords}
    assert [field for field in REQUIRED if field not in stated] == []


def test_a_dialect_that_leaves_one_out_is_refused_as_it_is_built() -> None:
    given = {field: getattr(base.GENERIC, field) for field in REQUIRED if field != "address_form"}
    with pytest.raises(TypeError, match="address_form"):
        base.DialectSupport(**given)
