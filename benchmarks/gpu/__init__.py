"""SGLang 0.5.15.post1 with capture on a bare GPU host: the kit to bring (``kit``, its list in ``contents``) and
the one script that runs there (``run``). docs/testing.md, "GPU kit"."""
