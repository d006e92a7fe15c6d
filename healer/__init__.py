"""healer: GPU node health remediation controller for Kubernetes."""

__version__ = "0.1.0"
