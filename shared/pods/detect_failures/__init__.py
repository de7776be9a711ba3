"""detect-failures: is this pod event a failure another node could fix? Pure (decide)."""
