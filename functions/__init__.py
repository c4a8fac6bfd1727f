"""Cloud Run functions the stack deploys; each folder is one function's whole source."""
