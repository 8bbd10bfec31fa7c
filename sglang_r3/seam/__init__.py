"""The seam between sglang-r3 and SGLang: every SGLang name touched (``manifest``), the hook registry
(``hooks``), the releases served and what differs between them (``release``, ``versions``), and how a name is
resolved or swapped. No SGLang import here runs at import time.
"""
