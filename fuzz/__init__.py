"""Fuzz harnesses for pygraphx's untrusted-input entry points (see fuzz/README.md)."""
