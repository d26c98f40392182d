"""Each engine's harness, side by side: ``vllm/`` (vLLM's scheduler, connector and manager
interface) and ``sglang/`` (SGLang's hierarchical cache); what they share (the model adapter,
the lockstep oracle, the machines' plumbing) is the rest of ``properties/``."""
