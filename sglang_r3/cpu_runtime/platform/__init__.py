"""What a CUDA platform gives SGLang, for CPU processes: driver calls, ranks and collectives, expert
parallelism's reduce, PD's host page ids.
"""
