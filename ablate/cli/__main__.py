"""``python -m ablate.cli``: the same as the ``ablate`` command."""

from ablate.cli import main

main()
