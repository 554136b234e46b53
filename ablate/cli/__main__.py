"""``python -m ablate.cli``: the same as the ``ablate`` command."""

from . import main

main()
