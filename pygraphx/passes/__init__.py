"""Target-independent passes, one per module, named after MIGraphX's passes."""
