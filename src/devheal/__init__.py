"""devheal: Kubernetes that heals itself around failing accelerators."""

__version__ = "0.1.0"
