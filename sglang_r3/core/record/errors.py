"""The one error type of records: malformed, or not belonging where it is used."""


class RecordError(ValueError):
    """A routing record that is malformed or does not belong where it is used."""
