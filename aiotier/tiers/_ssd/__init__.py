"""The parts of the SSD tier; :class:`aiotier.tiers.ssd.SSDTier` composes them.

``layout`` names what is on disk, ``syscalls`` is the work done on the tier's threads,
``hops`` runs disk ops on those threads in batches (and knows nothing of blocks), ``ops`` are
the block reads, writes and unlinks as data, and ``turns`` keeps writes and removes of one key
apart. Imports point one way: ``layout``, ``syscalls`` ← ``hops`` ← ``ops`` ← ``tiers/ssd.py``.
"""
