"""SQL storage of the ledger: one schema over SQLite, PostgreSQL and MySQL/MariaDB."""
