"""A STAND-IN for the processor code Kimi-K2.5 ships on the Hub (``kimi_k25_processor.py``, loaded with
``--trust-remote-code``), which cannot be fetched on a host without the Hub.

SGLang's Kimi-K2.5 processor (sglang/srt/multimodal/processors/kimi_k25.py) builds at start-up from the remote
processor's ``media_processor.media_proc_cfg`` (the ``media_proc_cfg`` section of the release's
preprocessor_config.json), and on a host without CUDA it prepares an image through the remote processor's API:
``media_processor.media_tokens_calculator(media)`` (how many placeholder tokens an image takes) and
``processor(text=[expanded text], medias=[...])`` (input ids, ``pixel_values``, ``grid_thws``). This class is
transformers' own ``Kimi_K25Processor`` with that API added on top of transformers' image processor: the pixels SGLang
serves are the ones transformers' processor makes, which the tests' oracle feeds transformers' model. Routing is not
touched here.
"""

import json
import os

from transformers import Kimi_K25Processor


class _MediaProcessor:
    def __init__(self, media_proc_cfg, image_processor):
        self.media_proc_cfg = media_proc_cfg
        self.image_processor = image_processor

    def media_tokens_calculator(self, media):
        grid = self.image_processor(images=[media["image"]], return_tensors="pt")["image_grid_thw"][0]
        merge = self.media_proc_cfg["merge_kernel_size"]
        return int(grid.prod()) // (merge * merge)


class KimiK25Processor(Kimi_K25Processor):
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        processor = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        with open(os.path.join(pretrained_model_name_or_path, "preprocessor_config.json")) as f:
            cfg = json.load(f)["media_proc_cfg"]
        processor.media_processor = _MediaProcessor(cfg, processor.image_processor)
        return processor

    def __call__(self, *args, medias=None, **kwargs):
        if medias is None:
            return super().__call__(*args, **kwargs)
        # The remote processor's call: the text already holds each image's placeholder tokens.
        out = dict(self.tokenizer(kwargs.pop("text"), return_tensors="pt"))
        pixels = self.image_processor(images=[m["image"] for m in medias], return_tensors="pt")
        out["pixel_values"] = pixels["pixel_values"]
        out["grid_thws"] = pixels["image_grid_thw"]
        return out
