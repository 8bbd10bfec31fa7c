"""What cannot be served exactly, refused: at start-up, naming the flag (``startup``), and per request, naming
the field (``input_guard``).
"""
