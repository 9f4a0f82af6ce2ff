"""Alembic revisions of sqlqueue_orm: queue table upgrades and shared tables."""
