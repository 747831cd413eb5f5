"""MIG geometry: profiles, placements, the built-in catalog for emulation, device names."""
