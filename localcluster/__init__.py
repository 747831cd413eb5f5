"""localcluster package."""
