"""The admission webhook (DESIGN section 3): mutating and validating, reading only from watch caches."""
