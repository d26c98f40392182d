"""Release infrastructure, as code that bench/, docs/, tests and .ci/run all import: which
upstream releases are gated, building their environments, running code inside them, and the
mended targets (a release with only its known defects put right).

- ``vllm``: the vLLM releases CI gates (``.ci/vllm-releases.txt``), where their environments
  are, running a script in one (standard library only: .ci/run reads it before any install);
- ``vllm_build``: building those environments on one shared base (spec §10);
- ``vllm_mends``: each gated release with only its known defects mended.
"""
