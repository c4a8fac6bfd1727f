"""tpu_training: the TensorFlow TPUStrategy job every tpu-stack node runs.

Importing the package must not import TensorFlow: the infra side imports
`tpu_training.config` to validate stack jobs in an environment without it.
"""
