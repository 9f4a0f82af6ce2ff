"""Topic names: an event's type and its base types, named as .NET names them.

NServiceBus's topic is ``Type.FullName`` (``TopicName.From``), and a publish looks up the
subscribers of the event's type, every base class and every interface
(``PolymorphicSubscriptionStore.GenerateMessageHierarchy``). Here the hierarchy is the pydantic
model's MRO: the class, its bases and mixins, in MRO order, without Python's and pydantic's own
classes (:data:`NOT_TOPICS`). Each is named by the mapping given (a model standing for a .NET
type, registered with ``Endpoint.handle(..., type_name=...)`` or ``Endpoint.map_type``), else
``module.QualName``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlqueue_orm import exceptions, headers


def python_name(model: type[Any]) -> str:
    """``module.QualName``: the name of *model* when no .NET name is mapped."""
    return f"{model.__module__}.{model.__qualname__}"


def topic_of(model: type[Any], names: Mapping[type[Any], str] | None = None) -> str:
    """The topic of *model*: its mapped .NET name, else ``module.QualName``."""
    mapped = (names or {}).get(model)
    return mapped if mapped else python_name(model)


#: Modules whose classes are never topics: Python's and pydantic's own bases (``object``,
#: ``typing.Generic``, ``pydantic.BaseModel``) carry no meaning a subscriber could choose.
NOT_TOPICS = frozenset({"builtins", "typing", "pydantic", "abc"})


def hierarchy(model: type[Any]) -> list[type[Any]]:
    """*model* and its base classes in MRO order, without Python's and pydantic's own."""
    return [cls for cls in model.__mro__ if cls.__module__.split(".", 1)[0] not in NOT_TOPICS]


def topics_of(model: type[Any], names: Mapping[type[Any], str] | None = None) -> list[str]:
    """The topics a publish of *model* reaches: its own first, then its bases' (distinct)."""
    return list(dict.fromkeys(topic_of(cls, names) for cls in hierarchy(model)))


def topics_of_headers(message_headers: Mapping[str, str | None]) -> list[str]:
    """The full type names of ``NServiceBus.EnclosedMessageTypes`` (assembly parts cut off)."""
    enclosed = message_headers.get(headers.ENCLOSED_MESSAGE_TYPES) or ""
    names = (entry.split(",", 1)[0].strip() for entry in enclosed.split(";"))
    return list(dict.fromkeys(name for name in names if name))


def check_topic(topic: object) -> str:
    """*topic* if it is a usable topic name, else :class:`ConfigurationError` naming it."""
    if not isinstance(topic, str) or not topic.strip():
        raise exceptions.ConfigurationError(f"topic {topic!r} must be a non-empty type name")
    if len(topic) > 200:
        raise exceptions.ConfigurationError(
            f"topic {topic[:60]!r}... is {len(topic)} characters; the subscription table "
            "holds 200"
        )
    return topic
