"""The object-store tier: the tier (``tier.py``), the obstore calls it makes (``client.py``),
how it sends requests (``requests.py``: concurrency, retries, deadlines), what it remembers of
objects (``memory.py``) and the look-ahead of lookups (``lookahead.py``)."""

from .tier import ObjectStoreTier

__all__ = ["ObjectStoreTier"]
