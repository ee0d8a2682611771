"""caps."""
