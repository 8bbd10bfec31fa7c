"""The shared foundation: the record, the layout and its family registry, settings, error codes."""
