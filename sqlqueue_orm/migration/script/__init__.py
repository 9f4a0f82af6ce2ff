"""Alembic script directory shipped inside the package (env.py lives here)."""
