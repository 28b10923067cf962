"""The reference target: every operator's numpy `compute()`, no rewrites (the oracle)."""
