"""The tpu-stack policy pack: `pulumi preview --policy-pack policy`."""
