"""The exception tree: one root, named by what went wrong."""

from __future__ import annotations

__all__ = [
    "BlockCorruptedError",
    "BlockNotReadyError",
    "ConfigError",
    "TierUnavailableError",
    "TieringError",
]


class TieringError(Exception):
    """Root of every error aiotier raises on purpose."""


class BlockNotReadyError(TieringError, KeyError):
    """A block was asked for that is not loadable (not a HIT) in the primary tier."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class ConfigError(TieringError, ValueError):
    """A constructor or configuration value is invalid."""


class TierUnavailableError(TieringError):
    """A tier cannot serve requests right now (server gone, circuit open, closed)."""


class BlockCorruptedError(TieringError):
    """Stored bytes failed verification (header, length or checksum); they were not returned."""
