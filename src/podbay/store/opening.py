"""Which store a server or an operator command opens: one setting decides.

``store.url`` empty: the SQLite file in the data directory (one host).
``postgresql://...`` (or ``postgres://...``): a shared PostgreSQL database;
needs the ``podbay[postgres]`` extra.
"""

from __future__ import annotations

from podbay.settings import Settings

from .base import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(settings: Settings) -> Store:
    """Open (and migrate) the store ``settings`` name; ValueError if it names none."""
    url = settings.store.url.strip()
    if not url:
        from .sqlite import SqliteStore

        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return SqliteStore.open(settings.data_dir / "podbay.db")
    if url.startswith(POSTGRES_SCHEMES):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise ValueError("store.url names PostgreSQL: install podbay[postgres]") from exc
        import psycopg

        try:
            return PostgresStore.open(url)
        except psycopg.OperationalError as exc:
            raise ValueError(f"store.url: cannot use the database: {exc}") from exc
    raise ValueError("store.url must be empty (SQLite) or a postgresql:// URL")
