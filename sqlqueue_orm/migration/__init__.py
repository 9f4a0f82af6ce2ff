"""Alembic migrations of queue tables and shared tables (filled in by the migrations issue)."""
