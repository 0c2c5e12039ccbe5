"""Worker loops and their supervisor; ``Worker`` runs them in-process."""

from .supervisor import Worker

__all__ = ["Worker"]
