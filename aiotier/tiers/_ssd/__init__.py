"""The parts of the SSD tier; :class:`aiotier.tiers.ssd.SSDTier` composes them.

On disk: ``layout`` (names and slot geometry), ``slot`` (the slot header), ``checkpoint`` (the
index saved at a clean close), ``scan`` (the index rebuilt from headers), ``startup`` (which of
the two, and how it went), ``directory`` (opening, locking, reserving space) and ``inspection``
(the read-only summary). In memory: ``index`` (the sans-IO index: plans and completions),
``reads`` and ``writes`` (a batch's plan against the index, sans-IO), ``handover`` (evicted
blocks on their way to the tier below) and ``turns`` (writes and removes of one key never
overlap). On the threads: ``hops`` runs disk ops in batches and knows nothing of blocks,
``ops`` are the slot reads, writes and clearings as data, ``syscalls`` their system calls.
Imports point one way: ``layout``, ``slot``, ``syscalls`` ← ``hops`` ← ``ops`` ← ``scan``,
``checkpoint`` ← ``startup`` ← ``directory`` ← ``tiers/ssd.py``; ``index``, ``ops``,
``handover`` ← ``reads``, ``writes`` ← ``tiers/ssd.py``.
"""
