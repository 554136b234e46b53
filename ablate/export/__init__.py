"""Hugging Face checkpoints out of ``ablate`` runs (``ablate export``; docs/export.md).

``export_cell`` writes a study cell's latest checkpoint as a ``transformers`` checkpoint folder,
``export_checkpoint`` a run's checkpoint folder, ``export_model`` a configuration and its weights;
``hf_checkpoint`` is the mapping from the trainer's model to ``transformers``' (the built-in decoder
as ``LlamaForCausalLM``), ``read_checkpoint`` reads a run's weights from either checkpoint form.
``transformers`` and ``safetensors`` are optional: ``pip install 'ablate[hf]'``.

Modules, by concept:

    mapping  the trainer's model to ``transformers``' names and config (``hf_checkpoint``)
    weights  a run's weights read from its checkpoint, one-process or sharded (``read_checkpoint``)
    writer   the checkpoint folder, its tokenizer and ``ablate_export.json`` (``export_cell``)
"""

from ablate.errors import ExportError
from ablate.export.mapping import DEPARTURES, hf_checkpoint, llama_checkpoint, permute_rotary
from ablate.export.weights import RunWeights, read_checkpoint
from ablate.export.writer import METADATA, export_cell, export_checkpoint, export_model, find_cell

__all__ = [
    "DEPARTURES",
    "METADATA",
    "ExportError",
    "RunWeights",
    "export_cell",
    "export_checkpoint",
    "export_model",
    "find_cell",
    "hf_checkpoint",
    "llama_checkpoint",
    "permute_rotary",
    "read_checkpoint",
]
