"""``python -m sglang_r3.tools.releases``: runs ``cli.main`` (options: ``--help``)."""

from sglang_r3.tools.releases.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
