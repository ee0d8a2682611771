"""console."""
