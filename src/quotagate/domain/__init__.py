"""Pure rules of quotagate: no I/O here."""
