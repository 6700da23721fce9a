from django.db import models

from pg_ticket.django import next_scoped_id


class Invoice(models.Model):
    shop = models.CharField(max_length=40)
    # Gap-free per shop and year: 1, 2, 3, ... (docs/python.md).
    number = models.BigIntegerField(editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["shop", "number"], name="one_number_per_shop")]

    def save(self, *args, **kwargs):
        # Inside the caller's transaction.atomic(): the number commits, or
        # rolls back, with this row.
        if self.number is None:
            self.number = next_scoped_id(f"shop-{self.shop}", "invoice/2026")
        super().save(*args, **kwargs)
