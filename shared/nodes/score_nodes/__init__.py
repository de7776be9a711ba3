"""score-nodes: the scheduler extender's filter and priorities (decide) and its HTTP (handler)."""
