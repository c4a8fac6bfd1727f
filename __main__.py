"""tpu-stack: Cloud TPU training capacity as code. Config in, TpuPlatform out."""

from components.program import declare, program_settings

declare(program_settings())
