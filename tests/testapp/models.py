"""Models the tests' activities write to."""

from django.db import models


class Ledger(models.Model):
    """One row per side effect an activity performed."""

    entry = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "testapp"

    def __str__(self) -> str:
        return self.entry
