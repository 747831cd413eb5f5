"""Capacity planning on the product's own placement engine: traces, replay, the fluid floor,
headroom of a live cluster and defragmentation plans. Pure: no I/O beyond trace files."""
