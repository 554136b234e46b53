"""The report's own exception, kept in a module that imports nothing heavy.

``speedup`` (imported by the study spec) and the pandas-based modules raise the same ``ReportError``;
the CLI turns it into a ``click.ClickException``. Messages are plain sentences that say what was
wrong, where, and what would be right.
"""

from __future__ import annotations


class ReportError(Exception):
    """A study cannot be reported as asked (bad input, undefined target, unsupported format)."""
