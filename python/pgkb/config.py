"""Configuration, read once from the environment with the same names in every entry point.

PGKB_DATABASE_URL   an existing PostgreSQL (else pgkb runs its embedded cluster, see pgkb.cluster); the
                    primary: ingest, worker, migrations and every other write go here
PGKB_READ_DATABASE_URL  where reads go (search, MCP): a hot standby, or a libpq multi-host URL with
                    target_session_attrs=prefer-standby (default: the same database as the writers)
PGKB_DATA_DIR, PGKB_PORT, PGKB_PG_BINDIR, PGKB_SHARED_BUFFERS   the embedded cluster (see pgkb.cluster)
PGKB_DB_DIR         where db/migrations and db/functions live (default: the SQL shipped with the package,
                    pgkb/sql, which is the repository's db/ in a checkout: see packaged_db_dir)
PGKB_EMBED_PROVIDER offline (default) | sentence-transformers | http
PGKB_EMBED_MODEL    registry name of the model (default: the database's default model); for
                    sentence-transformers also the model name or path to load (e.g. BAAI/bge-m3)
PGKB_EMBED_URL      OpenAI-compatible /v1/embeddings URL (provider http)
PGKB_EMBED_API_KEY  bearer token for PGKB_EMBED_URL
PGKB_EMBED_BATCH    texts per embedding call (default 16)
PGKB_VISION_URL     OpenAI-compatible vision chat endpoint (base URL …/v1 or the full …/chat/completions URL)
                    that captions images at ingest; unset: images are indexed by alt text, figure caption
                    and file name only (see pgkb.models.vision)
PGKB_VISION_MODEL   vision model name sent to it (default qwen-vl-max)
PGKB_VISION_API_KEY bearer token for PGKB_VISION_URL
PGKB_VISION_TIMEOUT seconds per caption request (default 60)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

PROVIDERS = ("offline", "sentence-transformers", "http")


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message says which variable to fix."""


def packaged_db_dir() -> Path:
    """db/ as the package ships it: pgkb/sql, a symlink to the repository's db/ in a checkout (an editable
    install or PYTHONPATH) and a copy of its migrations/ and functions/ in a wheel (package data)."""
    return Path(str(resources.files(__package__) / "sql"))


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    db_dir: Path
    embed_provider: str = "offline"
    embed_model: str | None = None
    embed_url: str | None = None
    embed_api_key: str = ""
    embed_batch: int = 16
    read_database_url: str | None = None
    vision_url: str | None = None
    vision_model: str = "qwen-vl-max"
    vision_api_key: str = ""
    vision_timeout: float = 60.0

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        provider = env.get("PGKB_EMBED_PROVIDER", "offline").strip() or "offline"
        if provider not in PROVIDERS:
            raise ConfigError(f"PGKB_EMBED_PROVIDER must be one of {', '.join(PROVIDERS)}, got {provider!r}")
        url = env.get("PGKB_EMBED_URL", "").strip() or None
        if provider == "http" and not url:
            raise ConfigError(
                "PGKB_EMBED_PROVIDER=http needs PGKB_EMBED_URL (e.g. http://127.0.0.1:8765/v1/embeddings)"
            )
        try:
            batch = int(env.get("PGKB_EMBED_BATCH", "16"))
        except ValueError as e:
            raise ConfigError("PGKB_EMBED_BATCH must be an integer") from e
        if not 1 <= batch <= 1024:
            raise ConfigError("PGKB_EMBED_BATCH must be between 1 and 1024")
        vision_url = env.get("PGKB_VISION_URL", "").strip() or None
        if vision_url and not vision_url.startswith(("http://", "https://")):
            raise ConfigError(f"PGKB_VISION_URL must be an http(s) URL, got {vision_url!r}")
        try:
            vision_timeout = float(env.get("PGKB_VISION_TIMEOUT", "60"))
        except ValueError as e:
            raise ConfigError("PGKB_VISION_TIMEOUT must be a number of seconds") from e
        if not 0 < vision_timeout <= 3600:
            raise ConfigError("PGKB_VISION_TIMEOUT must be between 0 and 3600 seconds")
        return cls(
            database_url=env.get("PGKB_DATABASE_URL", "").strip() or None,
            db_dir=Path(env.get("PGKB_DB_DIR") or packaged_db_dir()),
            read_database_url=env.get("PGKB_READ_DATABASE_URL", "").strip() or None,
            embed_provider=provider,
            embed_model=env.get("PGKB_EMBED_MODEL", "").strip() or None,
            embed_url=url,
            embed_api_key=env.get("PGKB_EMBED_API_KEY", ""),
            embed_batch=batch,
            vision_url=vision_url,
            vision_model=env.get("PGKB_VISION_MODEL", "").strip() or "qwen-vl-max",
            vision_api_key=env.get("PGKB_VISION_API_KEY", ""),
            vision_timeout=vision_timeout,
        )
