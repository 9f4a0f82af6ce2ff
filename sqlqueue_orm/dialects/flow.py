"""Flow control's statements on one database: slot claims, key leases, the rate schedule.

:class:`FlowStatements` is the group :attr:`~sqlqueue_orm.dialects.base.DialectSupport.flow`
holds; the limits of :mod:`sqlqueue_orm.receiving.flow` run them. Each dialect module that has
locks shared between processes fills one in (PostgreSQL's advisory locks, SQL Server's
``sp_getapplock``); a dialect without (SQLite) has ``None`` and its limits hold per process.
"""

from __future__ import annotations

import dataclasses


# Its fields are declared with their comments as DialectSupport's are (dialects/base.py): the
# same shape by the house style of a frozen group of statements, not shared code.
@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowStatements:
    """Flow control's statements on one database: slot claims, key leases, the rate schedule.

    A dialect without them (:attr:`~sqlqueue_orm.dialects.base.DialectSupport.flow` ``None``)
    has no locks shared between processes: its limits hold within one process (SQLite).
    """

    #: Claim a free one of ``:k`` slots named ``:name`` in the caller's transaction, ``:first``
    #: tried first, then the next ones (modulo ``:k``): the slot number, or no row or -1 when
    #: every slot is held. One slot at most is claimed.
    claim_slot: str
    #: Claim one slot of each of several limits in one statement, each tried from ``:first`` on
    #: as :attr:`claim_slot` does: how many limits got one. A limit refused leaves the others'
    #: locks taken (the caller rolls the transaction back).
    claim_slots: str
    #: Whether :attr:`claim_slots` takes two groups of names (``:prefix_a``, ``:names_a`` (a
    #: JSON array), ``:k_a``, and the same for ``b``) rather than one JSON document ``:claims``
    #: of ``[name, limit, index]``.
    grouped_claims: bool = False
    #: The claim of 0, 1, ... limits with scalar parameters (``:name_a``, ``:k_a``, ...), by
    #: count; ``()``: every claim of several limits goes through :attr:`claim_slots`.
    few_claims: tuple[str, ...] = ()
    #: Columns that follow the receive's own RETURNING list: each row's key (``:pattern``)
    #: and the claim of that key's slot (``:prefix``, ``:k``), and the global slot's claim
    #: (``:gname``, ``:gk``; ``:gk`` 0: none). ``None``: the receive cannot claim.
    receive_claiming: str | None = None
    #: The global slot's claim alone as a column after the receive's RETURNING list.
    receive_gated: str | None = None
    #: Claim key slots for the session (``:prefix``, ``:names``, ``:k``, ``:first``): one row
    #: per name with its slot, NULL when all are held. ``None``: no session claims.
    lease: str | None = None
    #: Give back session slots: ``:held`` a JSON array of ``[name, slot]`` after ``:prefix``.
    unlease: str | None = None
    #: The server process of the session (compared with the one the driver connected to).
    backend: str | None = None
    #: Reserve the next ``:step`` seconds of the rate schedule ``:name`` in ``{table}``, at
    #: most ``:wait`` seconds ahead, ``:tau`` seconds of idle credit: the seconds until the
    #: reserved start, or no row or NULL when none is that close.
    reserve: str
    #: Whether :attr:`reserve` is one statement, atomic alone (run in autocommit).
    reserve_alone: bool = False

    def claiming_receive(self, receive: str, keys: bool) -> str:
        """*receive* (a receive ending with its RETURNING list) claiming slots as it takes rows.

        :param keys: the key slots and the global slot (:attr:`receive_claiming`); else the
            global slot alone (:attr:`receive_gated`).
        :raises ValueError: this database's receive cannot claim (or returns no columns).
        """
        columns = self.receive_claiming if keys else self.receive_gated
        if columns is None or " RETURNING " not in receive:
            raise ValueError("this dialect's receive cannot claim slots")
        return f"{receive}, {columns}"
