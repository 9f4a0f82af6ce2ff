"""Publish/subscribe over NServiceBus's ``SubscriptionRouting`` table (its native pub/sub).

:mod:`~sqlqueue_orm.pubsub.topics` names an event's topics (its type and base types, as .NET
names them); :mod:`~sqlqueue_orm.pubsub.subscriptions` stores subscriptions with NServiceBus's own
statements and looks up the subscribers of topics through a per-type cache. The transport
(``Transport.publish``, ``subscribe``) and the endpoint build on them; ``docs/publish-subscribe.md``
is the manual.
"""
