"""Retention: each table of the fleet database keeps what its budget (age, rows) allows,
pruned in batches by the leader (docs/retention.md)."""
