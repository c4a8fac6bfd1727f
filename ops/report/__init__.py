"""`tpuctl report`: a stack's node histories as one self-contained HTML page."""
