"""Owns vLLM's engine behind tokenferry's ``Engine`` protocol: ``--engine vllm``.

vLLM is an optional dependency (the ``tokenferry[vllm]`` extra, ``make setup-vllm``);
nothing here imports it at module level, and ``launch.load_vllm_backend`` turns its
absence into one line telling how to install it. ``engine.py`` drives vLLM's
synchronous ``LLMEngine``; ``requests.py`` and ``outputs.py`` translate each way;
``launch.py`` builds it from the worker's settings; ``child.py`` ties vLLM's
engine-core process to the worker's life.
"""
