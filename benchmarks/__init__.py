"""Timing benchmarks, the GPU check and the scaling report and map; what their entry points share."""
import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows the module's docstring as written and every option's default."""


def entry_parser(module, doc):
    """The parser of `python -m <module>`, its description the module's docstring."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc, formatter_class=_Help)
