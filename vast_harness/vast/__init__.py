"""vast."""
