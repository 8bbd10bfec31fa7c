"""Tiny MoE checkpoints of each family, built and saved by transformers' own classes, and their routers' top-k as
transformers computes it (the oracle for tests/test_families.py).

Each checkpoint is what a trainer exporting with transformers 5 writes: ``<Family>ForCausalLM(config)`` with random
weights (fixed seed), ``save_pretrained`` (config.json in the class's own spelling, safetensors), plus the embedded
byte-level tokenizer so text prompts work offline. One module per job:

- ``specs``: ``CheckpointSpec`` and the table of specs (``SPECS``), ``FLIPPED`` and ``REFUSED_FLIPS``;
- ``published``: the media tokens, processor files and rewriters that make a saved folder what the release ships,
  the stand-ins for a release's own config code (``STAND_INS``), ``PUBLISHED_KEYS``, ``architecture_of``;
- ``build``: a spec's checkpoint folder (``build``) and transformers' model with its weights drawn (``initialized``);
- ``oracle``: transformers' model of a checkpoint (``load_transformers``) and its routers' top-k (``RouterTrace``);
- ``groups``: the servers' flags and the groups that start together (``SERVERS``, ``GROUPS``, ``serve_group``).

(Not ``sglang_r3.core.families``, the registry of layout rules: a spec here is a checkpoint, not a family's rule.)
"""
