"""The tiny Django app of the Django how-to's test (docs/howto/django.md)."""
