"""The benchmark suite behind ``aiotier bench`` (method: ratios to a floor and a peer, one run).

It lives beside the library, not in it: ``aiotier bench`` finds it in a clone of the repository
(``benchmarks/``) or installed as the ``aiotier-bench`` distribution (``pip install ./benchmarks``).

Every case is named as in ``shared/BENCHMARKS.md``; ``aiotier bench --case NAME`` runs only the
named ones (repeatable). :data:`CASE_GROUPS` lists them by the module that measures them; it is
kept here, import-light, so the command line can offer the names without importing the suite.
"""

__all__ = ["CASE_GROUPS", "CASE_NAMES"]

CASE_GROUPS: dict[str, tuple[str, ...]] = {
    "core": (
        "lookup_hit", "lookup_prefix", "scale", "memory", "memory_promote", "metrics_overhead",
        "policy", "blocking_lookup_hit",
    ),
    "ssd": ("ssd_promote", "ssd_demote", "ssd_open"),
    "redis": ("redis_promote",),
    "s3": ("object_promote",),
    "cache": (
        "cache_hit", "cache_stampede", "cache_large_value", "cache_ttl", "cache_write_through"
    ),
    # request traces replayed through the policies; --trace FILE replays a user's own
    "trace": ("trace",),
    # derived from the ticker figures of ssd_promote and redis_promote (which it runs)
    "derived": ("loop_lag",),
}  # fmt: skip

CASE_NAMES: tuple[str, ...] = tuple(n for names in CASE_GROUPS.values() for n in names)
