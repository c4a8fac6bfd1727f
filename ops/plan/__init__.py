"""The offline plan: the program run under the mock engine, its report, the diff against a base."""
