"""annotate-usage: each node's usage from a source (sources), what to record (decide), the
writes (handler)."""
