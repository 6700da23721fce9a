from django.db import models
from django.db.models import Func

from pg_ticket.django import next_scoped_id

from . import ids


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


class Shipment(models.Model):
    # A snowflake made in this process (djapp/ids.py): no round trip.
    id = models.BigIntegerField(primary_key=True, default=ids.next_id, editable=False)
    carrier = models.CharField(max_length=40)


class Event(models.Model):
    # A snowflake made by the database (Django 5's db_default): save()
    # reads it back (INSERT ... RETURNING).
    id = models.BigIntegerField(primary_key=True, db_default=Func(function="snowflake_id", output_field=models.BigIntegerField()), editable=False)
    kind = models.CharField(max_length=40)
