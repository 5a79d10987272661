"""Allow ``python -m scio_recorder``, same as the ``scio-recorder`` command."""

from scio_recorder.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
