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


urlpatterns = [path("shops/<str:shop>/invoices", create_invoice)]
