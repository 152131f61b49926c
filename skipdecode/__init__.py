"""SkipDecode: batched, KV-cached skip decoding (Del Corro et al., 2023) on Hugging Face models.

    from skipdecode import Engine, for_speedup
    engine = Engine.load()                                  # bundled SmolLM2-135M-Instruct
    result = engine.generate(["Describe a cafe."], for_speedup(3, engine.num_layers, horizon=64))
    result.texts, result.trace.to_frame()
"""

from .beam import Beam
from .engine import Engine, Generation
from .models import DEFAULT_MODEL, load_model
from .sampling import Sampling
from .schedule import Schedule, for_speedup
from .trace import StepRecord, Trace

__all__ = ["Beam", "Engine", "Generation", "Sampling", "Schedule", "StepRecord", "Trace", "for_speedup", "load_model",
           "DEFAULT_MODEL"]
__version__ = "0.1.0"
