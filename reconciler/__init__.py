"""reconciler: a pull-based GitOps agent for fleets of servers."""

__version__ = "0.1.0"
