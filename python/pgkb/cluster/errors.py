"""The one exception of the embedded cluster."""

from __future__ import annotations

__all__ = ["ClusterError"]


class ClusterError(RuntimeError):
    """The embedded cluster could not be located, initialised, started or stopped."""
