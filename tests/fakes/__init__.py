"""Loopback stand-ins for Google Cloud: a metadata server, a GCS emulator, a fault proxy."""
