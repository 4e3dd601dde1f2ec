"""``python -m trimtab.cli ...`` is the ``trimtab`` command (how the tests and the local cluster start it)."""

from trimtab.cli.main import main

if __name__ == "__main__":
    main()
