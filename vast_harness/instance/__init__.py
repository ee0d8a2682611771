"""instance."""
