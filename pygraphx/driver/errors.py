"""The driver's own error: a problem with the command line or its inputs."""

from __future__ import annotations


class DriverError(Exception):
    """A problem with the command line or its inputs; the message says what to change."""
