"""What the networked tiers (Redis, object store) share: a circuit of their own around the
server (``outage.py``) and the refusal of copies a cut-short write may have left
(``late_writes.py``)."""
