"""Named system locks (the leader lock): taken, renewed and expired on the database clock."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, When

from ..models import SystemLock
from .db import Database
from .operation import operation

__all__ = ["Locks"]


class Locks:
    """Named locks with an owner, an epoch and an expiry (``store.locks``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @operation
    def try_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take or renew a named lock; True while ``owner`` holds it."""
        with self.db.atomic():
            now = self.db.now_expr()
            updated = (
                SystemLock.objects.using(self.db.alias)
                .filter(Q(name=name) & (Q(owner=owner) | Q(expires_ms__lt=now)))
                .update(
                    epoch=Case(When(owner=owner, then=F("epoch")), default=F("epoch") + 1),
                    owner=owner,
                    expires_ms=self.db.now_expr(ttl),
                )
            )
            if updated:
                return True
            if SystemLock.objects.using(self.db.alias).filter(name=name).exists():
                return False
            try:
                with transaction.atomic(using=self.db.alias):
                    SystemLock.objects.using(self.db.alias).create(
                        name=name, owner=owner, epoch=1, expires_ms=self.db.now_expr(ttl)
                    )
            except IntegrityError:
                return False
            return True

    @operation
    def unlock(self, name: str, owner: str) -> None:
        """Release a lock ``owner`` holds (nothing when it does not)."""
        SystemLock.objects.using(self.db.alias).filter(name=name, owner=owner).update(
            owner="", expires_ms=0
        )

    @operation
    def lock_owner(self, name: str) -> str | None:
        """The current holder of a lock, or None when it is free or expired."""
        row = (
            SystemLock.objects.using(self.db.alias)
            .filter(name=name, expires_ms__gte=self.db.now_expr())
            .exclude(owner="")
            .values_list("owner", flat=True)
            .first()
        )
        return row
