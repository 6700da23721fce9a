"""A Django app numbering invoices gap-free with pg_ticket (test_django.py);
the pattern docs/python.md shows."""
