"""The CPU/dev runtime: SGLang on a host without a GPU, and the embedded default model."""
