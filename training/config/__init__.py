"""Command line, run configuration files, and which flags fit this machine."""
