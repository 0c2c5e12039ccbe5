"""Worker loops and their supervisor; ``Worker`` runs them in-process."""

from .runtime import HungAttempt
from .supervisor import Worker

__all__ = ["HungAttempt", "Worker"]
