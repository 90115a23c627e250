"""The ``quotagate`` command line."""
