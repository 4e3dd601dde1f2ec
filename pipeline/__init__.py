"""The data pipeline on Spark (docs/pipeline.md): ``trimtab pipeline ingest|compact|report``.

Modules that need PySpark (the optional ``spark`` extra) import it at their top; the command group (``trimtab.cli.pipeline``) does not,
and checks for it when a command runs. Nothing in the runtime imports this package (import-linter).
"""

from trimtab import refuse_bare_import

refuse_bare_import(__name__)
