"""Topic names of published events: the type and its bases, as .NET names them."""

from __future__ import annotations

from typing import Generic, TypeVar

import pydantic

from sqlqueue_orm import headers
from sqlqueue_orm.pubsub import topics

T = TypeVar("T")


class Auditable:
    """A mixin: stands where a .NET interface would."""


class OrderEvent(pydantic.BaseModel):
    order_id: int


class OrderPlaced(OrderEvent, Auditable):
    total: int = 0


class Envelope(pydantic.BaseModel, Generic[T]):
    item: T


def test_the_hierarchy_is_the_mro_without_python_and_pydantic_bases():
    here = __name__
    assert topics.topics_of(OrderPlaced) == [
        f"{here}.OrderPlaced",
        f"{here}.OrderEvent",
        f"{here}.Auditable",
    ]
    assert topics.topics_of(Envelope[int]) == [f"{here}.Envelope[int]", f"{here}.Envelope"]


def test_mapped_names_replace_python_names():
    names = {OrderPlaced: "Shop.Events.OrderPlaced", Auditable: "Shop.IAuditable"}
    assert topics.topics_of(OrderPlaced, names) == [
        "Shop.Events.OrderPlaced",
        f"{__name__}.OrderEvent",
        "Shop.IAuditable",
    ]


def test_topics_of_an_enclosed_message_types_header():
    value = "Shop.Events.OrderPlaced, Shop, Version=1.0.0.0;Shop.IAuditable, Shop"
    assert topics.topics_of_headers({headers.ENCLOSED_MESSAGE_TYPES: value}) == [
        "Shop.Events.OrderPlaced",
        "Shop.IAuditable",
    ]
    assert topics.topics_of_headers({}) == []
