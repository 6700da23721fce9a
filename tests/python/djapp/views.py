from asgiref.sync import sync_to_async
from django.db import transaction
from django.http import HttpResponse, JsonResponse
from django.urls import path

from .models import Invoice


class Refused(Exception):
    """The order failed after the invoice was numbered: all of it rolls back."""


def create_invoice(request, shop):
    try:
        with transaction.atomic():
            invoice = Invoice(shop=shop)
            invoice.save()
            if request.POST.get("fail") == "1":
                raise Refused()
    except Refused:
        return HttpResponse(status=409)
    return JsonResponse({"number": invoice.number})


# An async view: the ORM (and pg_ticket.django with it) runs in a sync
# function, the transaction whole inside it.
@sync_to_async
def numbered_invoice(shop):
    with transaction.atomic():
        invoice = Invoice(shop=shop)
        invoice.save()
        return invoice.number


async def create_invoice_async(request, shop):
    return JsonResponse({"number": await numbered_invoice(shop)})


urlpatterns = [
    path("shops/<str:shop>/invoices", create_invoice),
    path("async/shops/<str:shop>/invoices", create_invoice_async),
]
