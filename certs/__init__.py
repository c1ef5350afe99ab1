"""Certificates: a CA and serving/client certificates made with `cryptography` (DESIGN section 5)."""
