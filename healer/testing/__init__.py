"""Test and demo helpers that are real programs, not mocks (an emulated Kubernetes API server)."""
