# Stubs of the vLLM 0.32 surface capkv uses; checked against vLLM with mypy.stubtest.
