"""Adapters that change the cluster: the Kubernetes API (and a dry-run recorder with the same shape)."""
