"""Scripts the tests run in child processes (by path or with ``python -m``)."""
