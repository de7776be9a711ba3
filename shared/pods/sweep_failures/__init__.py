"""sweep-failures: a periodic list of pods finds failing ones no event reported (handler)."""
