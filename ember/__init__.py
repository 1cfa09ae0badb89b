"""ember: LLM inference and serving on the hardware you have.

`from ember import LLM, SamplingParams` is the offline entry point; `ember serve` the server.
"""

from ember.engine.outputs import CompletionOutput, RequestOutput
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]
