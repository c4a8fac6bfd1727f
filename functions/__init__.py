"""Cloud Run functions the stack deploys; each folder is one function's whole source
(it ships alone): imports nothing else of tpu-stack. model/meter.py shares its arithmetic.
"""
