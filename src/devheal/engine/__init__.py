"""The pure core: findings from the cluster view, and decisions from findings. No I/O."""
