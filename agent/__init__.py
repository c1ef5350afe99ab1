"""The node-lock agent (DESIGN section 4): watch caches -> snapshot -> planner (pure) -> applier -> statuses."""
