"""The Redis tier: the tier (``tier.py``), its zero-copy MGET reader (``reader.py``) over a
sans-IO RESP parser (``parser.py``), and the late-write doubt that redis-py's retries need
(``late.py``)."""

from .tier import RedisTier

__all__ = ["RedisTier"]
