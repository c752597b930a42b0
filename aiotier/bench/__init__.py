"""The benchmark suite behind ``aiotier bench`` (method: ratios to a floor and a peer, one run)."""
