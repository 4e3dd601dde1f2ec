"""The ``trimtab`` command (``cli.main``): the daemons, the admin client (``cli.admin``), the simulator,
the pipeline and the dev kit's commands, with their shared options and settings loading (``cli.common``).

The command line sits on top of every room and nothing in the runtime imports it (import-linter); this
``__init__`` imports nothing, so ``trimtab.cli.common`` can be used by a command group (the pipeline's)
without loading every other command.
"""

from trimtab import refuse_bare_import

refuse_bare_import(__name__)
