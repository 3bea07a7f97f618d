"""Vision-Language-Action policies (AcceRL) over a user's own model: the policy, Hugging Face loading, LoRA,
``lm_head`` pruning, value heads, vision, ``VLAModule``, SFT, self-imitation and demonstrations (the ``vla``
extra). ``transformers`` and ``peft`` are imported only under this folder."""
