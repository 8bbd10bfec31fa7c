"""Generic torch versions of SGLang's CUDA / Triton kernels (attention, rotations, mixers, speculative ops).
"""
