"""Load-aware placement and rebalancing: node usage on the Node (annotate-usage), the scheduler
extender (score-nodes) and rebalancing (rebalance-nodes)."""
