"""Files the vLLM process imports: this folder alone is put on its ``PYTHONPATH`` (vLLM's own environment).

They import the standard library, vLLM and what vLLM depends on, never ``nemo_tau2``; the project imports
``nemo_tau2_token_splice`` from here too, so the splice rule has one implementation.
"""
